"""The ensemble tests' own model repository: composing models, ensembles over them, and
the server fixture that serves it (kept apart from the shared session repository)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server_process import TritiumProcess
from tests.zoo import DECOUPLED, _parameter, _tensor, add_model

# The pipeline's stages, each `slow` (tests/models/slow.py) recording into <name>.jsonl;
# stage k works for the ensemble input its INPUT0 maps to and reads AFTER (the previous
# stage's output) only so that it runs after it.
STAGES = ("stage_1", "stage_2", "stage_3")
PIPELINE = "pipeline"
PIPELINE_INPUTS = {"stage_1": "INPUT0", "stage_2": "D2", "stage_3": "D3"}

Step = tuple[str, dict[str, str], dict[str, str]]  # model, input_map, output_map


def ensemble_config(name: str, io: str, steps: list[Step], max_batch_size: int = 0) -> str:
    lines = [f'name: "{name}"', 'platform: "ensemble"', f"max_batch_size: {max_batch_size}",
             io.rstrip("\n"), "ensemble_scheduling { step ["]
    for index, (model, inputs, outputs) in enumerate(steps):
        maps = " ".join(
            [f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items()]
            + [f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items()])
        comma = "," if index < len(steps) - 1 else ""
        lines.append(f'  {{ model_name: "{model}" model_version: -1 {maps} }}{comma}')
    lines.append("] }")
    return "\n".join(lines) + "\n"


def add_ensemble(repo: Path, name: str, io: str, steps: list[Step],
                 max_batch_size: int = 0) -> Path:
    model_dir = repo / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(ensemble_config(name, io, steps, max_batch_size))
    return model_dir


FP32_IO = _tensor("input", "INPUT0", "FP32", "-1") + _tensor("output", "OUTPUT0", "FP32", "-1")
ONE_IO = _tensor("input", "INPUT0", "FP32", "1") + _tensor("output", "OUTPUT0", "FP32", "1")


def build_ensemble_repository(repo: Path, record_dir: Path) -> Path:
    repo.mkdir(parents=True, exist_ok=True)
    _add_two_step(repo)
    _add_diamond(repo)
    _add_streaming(repo)
    _add_pipeline(repo, record_dir)
    _add_bls(repo)
    _add_batching(repo, record_dir)
    _add_forwarding(repo, record_dir)
    return repo


def _add_two_step(repo: Path) -> None:
    for name in ("ident_a", "ident_b"):
        add_model(repo, name, "identity", 'backend: "python"\n' + FP32_IO)
    add_ensemble(repo, "two_step", FP32_IO, [
        ("ident_a", {"INPUT0": "INPUT0"}, {"OUTPUT0": "middle"}),
        ("ident_b", {"INPUT0": "middle"}, {"OUTPUT0": "OUTPUT0"}),
    ])
    # An ensemble as a step of another.
    add_ensemble(repo, "nested", FP32_IO, [
        ("two_step", {"INPUT0": "INPUT0"}, {"OUTPUT0": "inner"}),
        ("ident_a", {"INPUT0": "inner"}, {"OUTPUT0": "OUTPUT0"}),
    ])


def _add_diamond(repo: Path) -> None:
    """(A, B) -> add_sub -> (A+B, A-B) -> an identity on each branch -> add_sub -> (2A, 2B)."""
    sixteen = "".join(_tensor(kind, name, "FP32", "16") for kind, name in (
        ("input", "INPUT0"), ("input", "INPUT1"), ("output", "OUTPUT0"), ("output", "OUTPUT1")))
    for name in ("split", "join"):
        add_model(repo, name, "add_sub", sixteen)
    for name in ("branch_left", "branch_right"):
        add_model(repo, name, "identity", FP32_IO)
    add_ensemble(repo, "diamond", sixteen, [
        ("split", {"INPUT0": "INPUT0", "INPUT1": "INPUT1"}, {"OUTPUT0": "sum", "OUTPUT1": "diff"}),
        ("branch_left", {"INPUT0": "sum"}, {"OUTPUT0": "left"}),
        ("branch_right", {"INPUT0": "diff"}, {"OUTPUT0": "right"}),
        ("join", {"INPUT0": "left", "INPUT1": "right"},
         {"OUTPUT0": "OUTPUT0", "OUTPUT1": "OUTPUT1"}),
    ])


def _add_streaming(repo: Path) -> None:
    """A decoupled step (repeat: COUNT responses, DELAY ms apart) and a step after it that
    runs once per response: the ensemble is decoupled and streams."""
    add_model(repo, "repeat", "repeat",
              DECOUPLED + _tensor("input", "INPUT0", "INT32", "1")
              + _tensor("input", "DELAY", "FP32", "1", " optional: true")
              + _tensor("output", "OUTPUT0", "INT32", "1"))
    add_model(repo, "ident_int", "identity",
              _tensor("input", "INPUT0", "INT32", "-1")
              + _tensor("output", "OUTPUT0", "INT32", "-1"))
    add_ensemble(repo, "streaming",
                 _tensor("input", "COUNT", "INT32", "1") + _tensor("input", "DELAY", "FP32", "1")
                 + _tensor("output", "OUTPUT0", "INT32", "1"), [
                     ("repeat", {"INPUT0": "COUNT", "DELAY": "DELAY"}, {"OUTPUT0": "index"}),
                     ("ident_int", {"INPUT0": "index"}, {"OUTPUT0": "OUTPUT0"}),
                 ])


def _add_pipeline(repo: Path, record_dir: Path) -> None:
    stage_io = (_tensor("input", "INPUT0", "FP32", "1")
                + _tensor("input", "AFTER", "FP32", "1", " optional: true")
                + _tensor("output", "OUTPUT0", "FP32", "1"))
    for name in STAGES:
        add_model(repo, name, "slow",
                  stage_io + _parameter("record_file", f"{record_dir}/{name}.jsonl"))
    io = ("".join(_tensor("input", name, "FP32", "1") for name in ("INPUT0", "D2", "D3"))
          + _tensor("output", "OUTPUT0", "FP32", "1"))
    add_ensemble(repo, PIPELINE, io, [
        ("stage_1", {"INPUT0": "INPUT0"}, {"OUTPUT0": "t1"}),
        ("stage_2", {"INPUT0": "D2", "AFTER": "t1"}, {"OUTPUT0": "t2"}),
        ("stage_3", {"INPUT0": "D3", "AFTER": "t2"}, {"OUTPUT0": "OUTPUT0"}),
    ])


def _add_bls(repo: Path) -> None:
    """BLS calling an ensemble, and an ensemble one of whose steps is a BLS model."""
    add_model(repo, "bls_to_two_step", "bls_target",
              FP32_IO + _parameter("target", "two_step"))
    add_model(repo, "bls_to_ident_b", "bls_target",
              FP32_IO + _parameter("target", "ident_b"))
    add_ensemble(repo, "with_bls", FP32_IO, [
        ("ident_a", {"INPUT0": "INPUT0"}, {"OUTPUT0": "middle"}),
        ("bls_to_ident_b", {"INPUT0": "middle"}, {"OUTPUT0": "OUTPUT0"}),
    ])
    # BLS into the pipeline: a client leaving the BLS request must reach every stage.
    add_model(repo, "bls_to_stage", "bls_target", ONE_IO + _parameter("target", "one_stage"))
    add_ensemble(repo, "one_stage", ONE_IO, [
        ("stage_1", {"INPUT0": "INPUT0"}, {"OUTPUT0": "OUTPUT0"}),
    ])


def _add_batching(repo: Path, record_dir: Path) -> None:
    """A dynamically batching model behind an ensemble: its requests share its queue."""
    add_model(repo, "batched", "batch_record",
              "max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 500000 }\n"
              + ONE_IO + _parameter("record_file", f"{record_dir}/batched.jsonl"))
    add_ensemble(repo, "batched_ensemble", ONE_IO, [
        ("batched", {"INPUT0": "INPUT0"}, {"OUTPUT0": "OUTPUT0"}),
    ], max_batch_size=8)


def _add_forwarding(repo: Path, record_dir: Path) -> None:
    """Ensembles that show what reaches a step: the request's parameters, its timeout, and
    a step's error."""
    echo_io = (_tensor("input", "INPUT0", "FP32", "-1")
               + _tensor("output", "PARAMS", "BYTES", "1"))
    add_model(repo, "params_echo", "parameters_echo", echo_io)
    add_ensemble(repo, "echo_params", echo_io,
                 [("params_echo", {"INPUT0": "INPUT0"}, {"PARAMS": "PARAMS"})])
    add_model(repo, "raises_step", "raises", FP32_IO)
    add_ensemble(repo, "failing", FP32_IO, [
        ("ident_a", {"INPUT0": "INPUT0"}, {"OUTPUT0": "middle"}),
        ("raises_step", {"INPUT0": "middle"}, {"OUTPUT0": "OUTPUT0"}),
    ])
    # A failing step beside a slow one (tests/models/slow.py, INPUT0 seconds of work).
    add_model(repo, "slow_beside", "slow",
              ONE_IO + _parameter("record_file", f"{record_dir}/slow_beside.jsonl"))
    add_ensemble(repo, "failing_beside_slow",
                 ONE_IO + _tensor("output", "OUTPUT1", "FP32", "-1"), [
                     ("slow_beside", {"INPUT0": "INPUT0"}, {"OUTPUT0": "OUTPUT0"}),
                     ("raises_step", {"INPUT0": "INPUT0"}, {"OUTPUT0": "OUTPUT1"}),
                 ])
    # Queue timeouts that a request may shorten: the ensemble request's own reaches it.
    add_model(repo, "timed", "batch_record",
              "max_batch_size: 1\ndynamic_batching { default_queue_policy { "
              "timeout_action: REJECT default_timeout_microseconds: 30000000 "
              "allow_timeout_override: true } }\n"
              + ONE_IO + _parameter("record_file", f"{record_dir}/timed.jsonl"))
    add_ensemble(repo, "timed_ensemble", ONE_IO, [
        ("timed", {"INPUT0": "INPUT0"}, {"OUTPUT0": "OUTPUT0"}),
    ], max_batch_size=1)


@pytest.fixture(scope="module")
def ensemble_records(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ensemble_records")


@pytest.fixture(scope="module")
def ensemble_server(tmp_path_factory: pytest.TempPathFactory,
                    ensemble_records: Path) -> Iterator[TritiumProcess]:
    repo = build_ensemble_repository(tmp_path_factory.mktemp("ensemble_repo"), ensemble_records)
    process = TritiumProcess(repo).start()
    yield process
    code = process.stop()
    assert code == 0, process.log()
