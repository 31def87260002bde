"""Ensemble validation, without a server: each of Triton's load-time ensemble errors.

The expected texts are Triton's (core: model_config_utils.cc ValidateEnsembleSchedulingConfig,
ensemble_utils.cc ValidateEnsembleConfig, model_repository_manager.cc's dependency checks).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from tritium.ensemble.validation import (
    EnsembleConfigError,
    circular_dependency,
    dependency_failed,
    is_ensemble,
    unavailable_models,
    validate_against_composing,
    validate_ensemble_scheduling,
    version_not_loaded,
)
from tritium.repository.config import ConfigError, load_model_config


def config(text: str) -> Any:
    return text_format.Parse(text, pb.ModelConfig())


def model(name: str, inputs: str, outputs: str, extra: str = "") -> Any:
    """A composing model: ``inputs``/``outputs`` as 'NAME:TYPE:d,d' separated by spaces."""
    return config(f'name: "{name}" backend: "python" {extra} '
                  + _tensors("input", inputs) + _tensors("output", outputs))


def _tensors(kind: str, spec: str) -> str:
    parts = []
    for item in spec.split():
        name, dtype, dims = item.split(":")
        parts.append(f'{kind} {{ name: "{name}" data_type: TYPE_{dtype} dims: [{dims}] }}')
    return " ".join(parts)


def ensemble(steps: str, inputs: str = "IN:FP32:4", outputs: str = "OUT:FP32:4",
             extra: str = "") -> Any:
    return config(f'name: "ens" platform: "ensemble" {extra} '
                  + _tensors("input", inputs) + _tensors("output", outputs)
                  + f" ensemble_scheduling {{ {steps} }}")


def step(model_name: str, inputs: dict[str, str], outputs: dict[str, str],
         version: int = -1) -> str:
    ins = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    outs = " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'step {{ model_name: "{model_name}" model_version: {version} {ins} {outs} }}'


TWO_STEPS = (step("a", {"X": "IN"}, {"Y": "mid"}) + step("b", {"X": "mid"}, {"Y": "OUT"}))
IDENTITY_A = model("a", "X:FP32:4", "Y:FP32:4")
IDENTITY_B = model("b", "X:FP32:4", "Y:FP32:4")


def raises(message: str) -> Any:
    return pytest.raises(EnsembleConfigError, match="^" + re.escape(message) + "$")


# -- stage 1: the ensemble's own config ----------------------------------------------------
def test_a_two_step_chain_is_valid_and_not_decoupled() -> None:
    ens = ensemble(TWO_STEPS)
    validate_ensemble_scheduling(ens)
    assert validate_against_composing(ens, {"a": IDENTITY_A, "b": IDENTITY_B}) is False
    assert is_ensemble(ens)
    assert not is_ensemble(IDENTITY_A)


def test_a_diamond_is_valid() -> None:
    steps = (step("a", {"X": "IN"}, {"Y": "left"}) + step("a", {"X": "IN"}, {"Y": "right"})
             + step("sum", {"L": "left", "R": "right"}, {"S": "OUT"}))
    ens = ensemble(steps)
    validate_ensemble_scheduling(ens)
    summing = model("sum", "L:FP32:4 R:FP32:4", "S:FP32:4")
    assert validate_against_composing(ens, {"a": IDENTITY_A, "sum": summing}) is False


@pytest.mark.parametrize(("text", "message"), [
    ('name: "ens" platform: "ensemble" input { name: "IN" data_type: TYPE_FP32 dims: [1] }',
     "ensemble scheduling must be set for ensemble ens whose platform is ensemble"),
    ('name: "m" backend: "python" ensemble_scheduling { step { model_name: "a" } }',
     "ensemble scheduling cannot be set for model 'm' whose platform is not ensemble"),
])
def test_platform_and_scheduling_go_together(text: str, message: str) -> None:
    """Triton: ensemble_scheduling needs platform "ensemble", and that platform needs it."""
    with raises(message):
        validate_ensemble_scheduling(config(text))


@pytest.mark.parametrize(("extra", "message"), [
    ("instance_group { kind: KIND_CPU }",
     "instance group should not be specified for ensemble 'ens'"),
    ("optimization { input_pinned_memory { enable: true } }",
     "optimization should not be specified for ensemble 'ens'"),
    ('model_warmup { name: "w" }', "model_warmup can not be specified for ensemble 'ens'"),
])
def test_fields_an_ensemble_cannot_have(extra: str, message: str) -> None:
    with raises(message):
        validate_ensemble_scheduling(ensemble(TWO_STEPS, extra=extra))


def test_steps_are_required() -> None:
    ens = config('name: "ens" platform: "ensemble" ensemble_scheduling { }')
    with raises("must specify 'step' for ensemble 'ens'"):
        validate_ensemble_scheduling(ens)


@pytest.mark.parametrize(("text", "field"), [
    ('step { input_map { key: "X" value: "IN" } output_map { key: "Y" value: "OUT" } }',
     "model_name"),
    ('step { model_name: "a" output_map { key: "Y" value: "OUT" } }', "input_map"),
    ('step { model_name: "a" input_map { key: "X" value: "IN" } }', "output_map"),
])
def test_each_step_names_its_model_and_maps(text: str, field: str) -> None:
    with raises(f"must specify '{field}' in step 0 of ensemble 'ens'"):
        validate_ensemble_scheduling(ensemble(text))


def test_a_tensor_written_by_two_steps() -> None:
    steps = step("a", {"X": "IN"}, {"Y": "OUT"}) + step("b", {"X": "IN"}, {"Y": "OUT"})
    with raises("ensemble tensor 'OUT' can appear in an output map only once for ensemble "
                "'ens' step 1"):
        validate_ensemble_scheduling(ensemble(steps))


def test_an_ensemble_input_no_step_reads() -> None:
    """Triton's text has an unmatched quote after the ensemble name; kept as it is."""
    ens = ensemble(TWO_STEPS, inputs="IN:FP32:4 SPARE:FP32:4")
    with raises("ensemble input 'SPARE' for ensemble ens' is not used"):
        validate_ensemble_scheduling(ens)


def test_an_ensemble_output_no_step_writes() -> None:
    ens = ensemble(TWO_STEPS, outputs="OUT:FP32:4 EXTRA:FP32:4")
    with raises("ensemble output 'EXTRA' for ensemble ens' is not used"):
        validate_ensemble_scheduling(ens)


def test_an_output_fed_by_a_tensor_nothing_produces() -> None:
    """A step reads a tensor that neither the ensemble's inputs nor any step provide."""
    steps = step("a", {"X": "IN", "Z": "ghost"}, {"Y": "mid"}) + step("b", {"X": "mid"},
                                                                      {"Y": "OUT"})
    with raises("output 'OUT' for ensemble 'ens' is not written: at least one of its depending "
                "tensors, 'ghost', is not connected"):
        validate_ensemble_scheduling(ensemble(steps))


def test_a_cycle_between_steps_leaves_its_tensors_unwritten() -> None:
    """Triton has no message of its own for a data cycle: its tensors never become ready,
    so the output they feed 'is not written'."""
    steps = step("a", {"X": "IN", "Z": "loop"}, {"Y": "OUT"}) + step("b", {"X": "OUT"},
                                                                     {"Y": "loop"})
    with raises("output 'OUT' for ensemble 'ens' is not written"):
        validate_ensemble_scheduling(ensemble(steps))


def test_a_tensor_written_but_never_read() -> None:
    steps = step("a", {"X": "IN"}, {"Y": "OUT", "Z": "leftover"})
    with raises("ensemble tensor 'leftover' is unused in ensemble 'ens'"):
        validate_ensemble_scheduling(ensemble(steps))


# -- stage 2: against the composing models ---------------------------------------------------
def test_mapping_to_an_input_the_model_does_not_have() -> None:
    ens = ensemble(step("a", {"X": "IN", "NOPE": "IN"}, {"Y": "OUT"}))
    with raises("in ensemble ens, ensemble tensor IN is mapping to non-existing input NOPE in "
                "model a"):
        validate_against_composing(ens, {"a": IDENTITY_A})


def test_a_required_input_left_unmapped() -> None:
    two_inputs = model("a", "X:FP32:4 W:FP32:4", "Y:FP32:4")
    ens = ensemble(step("a", {"X": "IN"}, {"Y": "OUT"}))
    with raises("in ensemble ens, input W in model a is not mapped to any ensemble tensors"):
        validate_against_composing(ens, {"a": two_inputs})


def test_an_optional_input_may_be_left_unmapped() -> None:
    optional = model("a", "X:FP32:4 W:FP32:4", "Y:FP32:4")
    optional.input[1].optional = True
    ens = ensemble(step("a", {"X": "IN"}, {"Y": "OUT"}))
    assert validate_against_composing(ens, {"a": optional}) is False


def test_mapping_from_an_output_the_model_does_not_have() -> None:
    ens = ensemble(step("a", {"X": "IN"}, {"NOPE": "OUT"}))
    with raises("in ensemble ens, ensemble tensor OUT is mapped from non-existing output NOPE "
                "in model a"):
        validate_against_composing(ens, {"a": IDENTITY_A})


def test_datatypes_disagree_between_steps() -> None:
    ints = model("b", "X:INT32:4", "Y:FP32:4")
    with raises("in ensemble ens, ensemble tensor mid: inconsistent data type: TYPE_FP32 is "
                "inferred from model a while TYPE_INT32 is inferred from model b"):
        validate_against_composing(ensemble(TWO_STEPS), {"a": IDENTITY_A, "b": ints})


def test_shapes_disagree_between_steps() -> None:
    wider = model("b", "X:FP32:8", "Y:FP32:4")
    with raises("in ensemble ens, ensemble tensor mid: inconsistent shape: [4] is inferred "
                "from model a while [8] is inferred from model b"):
        validate_against_composing(ensemble(TWO_STEPS), {"a": IDENTITY_A, "b": wider})


def test_the_ensemble_input_disagrees_with_the_first_step() -> None:
    ens = ensemble(TWO_STEPS, inputs="IN:INT64:4")
    with raises("in ensemble ens, ensemble tensor IN: inconsistent data type: TYPE_INT64 is "
                "inferred from model ens while TYPE_FP32 is inferred from model a"):
        validate_against_composing(ens, {"a": IDENTITY_A, "b": IDENTITY_B})


def test_wildcards_and_the_batch_dimension_match() -> None:
    """-1 matches any size; a non-batching model's [-1,4] matches a batching one's [4]."""
    variable = model("a", "X:FP32:-1", "Y:FP32:-1,4")
    flat = model("b", "X:FP32:4", "Y:FP32:4", extra="max_batch_size: 8")
    ens = ensemble(TWO_STEPS)
    assert validate_against_composing(ens, {"a": variable, "b": flat}) is False


def test_batched_shape_mismatch_shows_full_dims() -> None:
    batching = model("b", "X:FP32:2,2", "Y:FP32:4", extra="max_batch_size: 8")
    with raises("in ensemble ens, ensemble tensor mid: inconsistent shape: [4] is inferred "
                "from model a while [-1,2,2] is inferred from model b"):
        validate_against_composing(ensemble(TWO_STEPS), {"a": IDENTITY_A, "b": batching})


def test_a_composing_model_with_a_smaller_max_batch_size() -> None:
    small = model("a", "X:FP32:4", "Y:FP32:4", extra="max_batch_size: 2")
    big = model("b", "X:FP32:4", "Y:FP32:4", extra="max_batch_size: 8")
    ens = ensemble(TWO_STEPS, extra="max_batch_size: 4")
    with raises("ensemble ens allows maximum batch size 4, but it contains model a which only "
                "allows maximum batch size to be 2"):
        validate_against_composing(ens, {"a": small, "b": big})


def test_a_batching_ensemble_may_hold_a_non_batching_model() -> None:
    variable = model("a", "X:FP32:-1,4", "Y:FP32:-1,4")
    big = model("b", "X:FP32:4", "Y:FP32:4", extra="max_batch_size: 8")
    ens = ensemble(TWO_STEPS, extra="max_batch_size: 4")
    assert validate_against_composing(ens, {"a": variable, "b": big}) is False


DECOUPLED = "model_transaction_policy { decoupled: true }"


def test_a_decoupled_step_makes_the_ensemble_decoupled() -> None:
    engine = model("b", "X:FP32:4", "Y:FP32:4", extra=DECOUPLED)
    assert validate_against_composing(ensemble(TWO_STEPS), {"a": IDENTITY_A, "b": engine})


def test_steps_after_a_decoupled_step_stream_through() -> None:
    """tokenizer -> decoupled engine -> detokenizer: every later step sees one stream."""
    steps = (step("a", {"X": "IN"}, {"Y": "ids"}) + step("eng", {"X": "ids"}, {"Y": "tok"})
             + step("b", {"X": "tok"}, {"Y": "OUT"}))
    engine = model("eng", "X:FP32:4", "Y:FP32:4", extra=DECOUPLED)
    assert validate_against_composing(ensemble(steps),
                                      {"a": IDENTITY_A, "eng": engine, "b": IDENTITY_B})


def test_a_step_fed_by_two_decoupled_streams() -> None:
    """Triton names the model that first declared the step's output tensor: for an
    ensemble output, that is the ensemble itself."""
    steps = (step("eng", {"X": "IN"}, {"Y": "left"}) + step("eng", {"X": "IN"}, {"Y": "right"})
             + step("sum", {"L": "left", "R": "right"}, {"S": "OUT"}))
    engine = model("eng", "X:FP32:4", "Y:FP32:4", extra=DECOUPLED)
    summing = model("sum", "L:FP32:4 R:FP32:4", "S:FP32:4")
    with raises("in ensemble ens, step of model 'ens' receives inputs originated from "
                "different decoupled models"):
        validate_against_composing(ensemble(steps), {"eng": engine, "sum": summing})


def test_a_stream_joined_with_the_ensemble_input_is_refused() -> None:
    """The engine's stream and the request's own tensor are two origins too."""
    steps = (step("eng", {"X": "IN"}, {"Y": "tok"})
             + step("sum", {"L": "tok", "R": "IN"}, {"S": "mid"})
             + step("b", {"X": "mid"}, {"Y": "OUT"}))
    engine = model("eng", "X:FP32:4", "Y:FP32:4", extra=DECOUPLED)
    summing = model("sum", "L:FP32:4 R:FP32:4", "S:FP32:4")
    with raises("in ensemble ens, step of model 'sum' receives inputs originated from "
                "different decoupled models"):
        validate_against_composing(ensemble(steps),
                                   {"eng": engine, "sum": summing, "b": IDENTITY_B})


def test_outputs_of_one_decoupled_step_share_its_stream() -> None:
    """Two outputs of the same decoupled step are one origin: a step may read both."""
    steps = (step("eng", {"X": "IN"}, {"Y": "a", "Z": "b"})
             + step("sum", {"L": "a", "R": "b"}, {"S": "OUT"}))
    engine = model("eng", "X:FP32:4", "Y:FP32:4 Z:FP32:4", extra=DECOUPLED)
    summing = model("sum", "L:FP32:4 R:FP32:4", "S:FP32:4")
    assert validate_against_composing(ensemble(steps), {"eng": engine, "sum": summing})


# -- dependencies -----------------------------------------------------------------------------
def test_dependency_texts() -> None:
    assert unavailable_models("ens", ["z", "a", "z"]).message == (
        "ensemble ens contains models that are not available or ambiguous: a, z")
    assert dependency_failed("ens", "a", "boom").message == (
        "ensemble 'ens' depends on 'a' which has no loaded version. Model 'a' loading failed "
        "with error: boom")
    assert version_not_loaded("ens", "a", 3).message == (
        "ensemble 'ens' depends on 'a' whose required version 3 is not loaded.")


def test_circular_dependency_text() -> None:
    assert circular_dependency("e1", "e3").message == (
        "circular dependency between ensembles: e1 -> ... -> e3 -> e1")


# -- through the repository's config loading ---------------------------------------------
def test_an_ensemble_config_loads_without_instances_or_auto_complete(tmp_path: Path) -> None:
    """No instance group or pinned-memory optimization is filled in (Triton leaves both
    out for ensembles, and then refuses either if given), and no backend completes it."""
    model_dir = tmp_path / "ens"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(text_format.MessageToString(ensemble(TWO_STEPS)))

    def no_auto_complete(_dir: Any, _config: Any) -> Any:
        raise AssertionError("auto-complete ran on an ensemble")

    loaded = load_model_config(model_dir, no_auto_complete)
    assert not loaded.instance_group and not loaded.HasField("optimization")
    assert loaded.platform == "ensemble" and loaded.backend == ""


def test_an_ensemble_with_a_backend_is_refused(tmp_path: Path) -> None:
    model_dir = tmp_path / "ens"
    (model_dir / "1").mkdir(parents=True)
    text = text_format.MessageToString(ensemble(TWO_STEPS)) + 'backend: "python"\n'
    (model_dir / "config.pbtxt").write_text(text)
    with pytest.raises(ConfigError, match="Ensemble model 'ens' must have platform type "
                                          "'ensemble' and empty backend type"):
        load_model_config(model_dir, None)
