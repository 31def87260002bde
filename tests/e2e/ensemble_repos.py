"""Model repositories for the ensemble lifecycle tests: composing models, one ensemble
that holds together and one ensemble per load-time error, with the text Triton gives."""

from __future__ import annotations

from pathlib import Path

from tests.zoo import DECOUPLED, _tensor, add_model

Step = tuple[str, dict[str, str], dict[str, str]]  # model, input_map, output_map


def identity_config(datatype: str = "FP32", dims: str = "-1", extra: str = "") -> str:
    return (f'backend: "python"\n{extra}'
            + _tensor("input", "INPUT0", datatype, dims)
            + _tensor("output", "OUTPUT0", datatype, dims))


def add_identity(repo: Path, name: str, datatype: str = "FP32", dims: str = "-1",
                 extra: str = "") -> Path:
    return add_model(repo, name, "identity", identity_config(datatype, dims, extra))


def ensemble_config(steps: list[Step], inputs: str = "IN:FP32:-1", outputs: str = "OUT:FP32:-1",
                    extra: str = "", versions: dict[int, int] | None = None) -> str:
    """``inputs``/``outputs``: 'NAME:TYPE:dims' separated by spaces; ``versions``: a step's
    index -> its model_version (-1 otherwise)."""
    lines = ['platform: "ensemble"', extra]
    for kind, spec in (("input", inputs), ("output", outputs)):
        for item in spec.split():
            name, datatype, dims = item.split(":")
            lines.append(_tensor(kind, name, datatype, dims).rstrip("\n"))
    lines.append("ensemble_scheduling {")
    for index, (model, ins, outs) in enumerate(steps):
        version = (versions or {}).get(index, -1)
        maps = " ".join([f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in ins.items()]
                        + [f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outs.items()])
        lines.append(f'  step {{ model_name: "{model}" model_version: {version} {maps} }}')
    lines.append("}")
    return "\n".join(lines) + "\n"


def add_ensemble(repo: Path, name: str, config: str) -> Path:
    model_dir = repo / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(config)
    return model_dir


def chain(first: str, second: str) -> list[Step]:
    """IN -> first -> mid -> second -> OUT, identity models both."""
    return [(first, {"INPUT0": "IN"}, {"OUTPUT0": "mid"}),
            (second, {"INPUT0": "mid"}, {"OUTPUT0": "OUT"})]


def add_pipeline(repo: Path, name: str, first: str, second: str) -> None:
    """A two-step ensemble over two identity models of its own."""
    add_identity(repo, first)
    add_identity(repo, second)
    add_ensemble(repo, name, ensemble_config(chain(first, second)))


# -- one ensemble per error -------------------------------------------------------------------
INT_IN, INT_OUT = "IN:INT32:-1", "OUT:INT32:-1"


def add_composing_models(repo: Path) -> None:
    add_identity(repo, "a")
    add_identity(repo, "b")
    add_identity(repo, "ints", "INT32")
    add_identity(repo, "fixed4", dims="4")
    add_identity(repo, "fixed8", dims="8")
    add_identity(repo, "batch2", extra="max_batch_size: 2\n")
    add_model(repo, "pair", "identity", 'backend: "python"\n'
              + _tensor("input", "INPUT0", "INT32", "-1")
              + _tensor("input", "INPUT1", "INT32", "-1")
              + _tensor("output", "OUTPUT0", "INT32", "-1")
              + _tensor("output", "OUTPUT1", "INT32", "-1"))
    add_model(repo, "repeat", "repeat", 'backend: "python"\n' + DECOUPLED
              + _tensor("input", "INPUT0", "INT32", "1")
              + _tensor("output", "OUTPUT0", "INT32", "1"))
    add_model(repo, "broken", "bad_init", identity_config())


def _bad_configs() -> dict[str, tuple[str, str]]:
    """Ensemble name -> (its config, the text of Triton's error for it)."""
    streams = [("repeat", {"INPUT0": "IN"}, {"OUTPUT0": "left"}),
               ("repeat", {"INPUT0": "IN"}, {"OUTPUT0": "right"}),
               ("pair", {"INPUT0": "left", "INPUT1": "right"}, {"OUTPUT0": "mid"}),
               ("ints", {"INPUT0": "mid"}, {"OUTPUT0": "OUT"})]
    return {
        "bad_unknown": (
            ensemble_config(chain("a", "nowhere")),
            "ensemble bad_unknown contains models that are not available or ambiguous: nowhere"),
        "bad_ghost": (
            ensemble_config([("pair", {"INPUT0": "IN", "INPUT1": "ghost"}, {"OUTPUT0": "OUT"})],
                            INT_IN, INT_OUT),
            "output 'OUT' for ensemble 'bad_ghost' is not written: at least one of its "
            "depending tensors, 'ghost', is not connected"),
        "bad_cycle": (
            ensemble_config([("pair", {"INPUT0": "IN", "INPUT1": "loop"}, {"OUTPUT0": "OUT"}),
                             ("ints", {"INPUT0": "OUT"}, {"OUTPUT0": "loop"})], INT_IN, INT_OUT),
            "output 'OUT' for ensemble 'bad_cycle' is not written"),
        "bad_dtype": (
            ensemble_config(chain("a", "ints"), outputs="OUT:INT32:-1"),
            "in ensemble bad_dtype, ensemble tensor mid: inconsistent data type: TYPE_FP32 is "
            "inferred from model a while TYPE_INT32 is inferred from model ints"),
        "bad_shape": (
            ensemble_config(chain("fixed4", "fixed8"), inputs="IN:FP32:4", outputs="OUT:FP32:8"),
            "in ensemble bad_shape, ensemble tensor mid: inconsistent shape: [4] is inferred "
            "from model fixed4 while [8] is inferred from model fixed8"),
        "bad_output": (
            ensemble_config(chain("a", "b"), outputs="OUT:FP32:-1 EXTRA:FP32:-1"),
            "ensemble output 'EXTRA' for ensemble bad_output' is not used"),
        "bad_input": (
            ensemble_config(chain("a", "b"), inputs="IN:FP32:-1 SPARE:FP32:-1"),
            "ensemble input 'SPARE' for ensemble bad_input' is not used"),
        "bad_batch": (
            ensemble_config(chain("a", "batch2"), extra="max_batch_size: 4"),
            "ensemble bad_batch allows maximum batch size 4, but it contains model batch2 "
            "which only allows maximum batch size to be 2"),
        "bad_streams": (
            ensemble_config(streams, inputs="IN:INT32:1", outputs="OUT:INT32:-1"),
            "in ensemble bad_streams, step of model 'pair' receives inputs originated from "
            "different decoupled models"),
        "bad_self": (
            ensemble_config(chain("a", "bad_self")),
            "circular dependency between ensembles: bad_self -> ... -> bad_self -> bad_self"),
        "bad_version": (
            ensemble_config(chain("a", "b"), versions={1: 7}),
            "ensemble 'bad_version' depends on 'b' whose required version 7 is not loaded."),
        "bad_dependency": (
            ensemble_config(chain("a", "broken")),
            "ensemble 'bad_dependency' depends on 'broken' which has no loaded version. Model "
            "'broken' loading failed with error: "),
    }


BAD = {name: text for name, (_, text) in _bad_configs().items()}


def build_validation_repository(repo: Path) -> Path:
    """Every composing model, the ensemble ``good`` (a -> b) and each ``BAD`` ensemble."""
    add_composing_models(repo)
    add_ensemble(repo, "good", ensemble_config(chain("a", "b")))
    for name, (config, _) in _bad_configs().items():
        add_ensemble(repo, name, config)
    return repo
