"""config.pbtxt parsing, Triton's defaults, validation and auto-complete."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tritonclient.grpc import model_config_pb2 as pb

from tritium.core.errors import ErrorCode
from tritium.core.types import DataType, TensorSpec
from tritium.repository.config import (
    ConfigError,
    complete_model_config,
    load_model_config,
    tensor_specs,
    validate_model_config,
)

MODEL_PY = "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"

ADD_SUB = """
name: "add_sub"
backend: "python"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] optional: true }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_STRING dims: [ 4, -1 ] reshape: { shape: [ 2, 2, -1 ] } }
]
dynamic_batching { max_queue_delay_microseconds: 100 }
"""

ONE_IO = """
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 4 ] } ]
"""

KIND = pb.ModelInstanceGroup


def make_model(
    root: Path,
    name: str,
    config: str | None = ADD_SUB,
    versions: tuple[str, ...] = ("1",),
    model_file: str | None = "model.py",
) -> Path:
    """``root/name`` with an optional config.pbtxt and version dirs holding ``model_file``."""
    model_dir = root / name
    model_dir.mkdir(parents=True)
    if config is not None:
        (model_dir / "config.pbtxt").write_text(config)
    for version in versions:
        (model_dir / version).mkdir()
        if model_file:
            (model_dir / version / model_file).write_text(MODEL_PY)
    return model_dir


def load_text(tmp_path: Path, text: str, name: str = "m") -> Any:
    return load_model_config(make_model(tmp_path, name, text), None)


def load_error(tmp_path: Path, text: str | None, name: str = "m") -> str:
    with pytest.raises(ConfigError) as caught:
        load_model_config(make_model(tmp_path, name, text), None)
    assert caught.value.code is ErrorCode.INVALID_ARG
    return caught.value.message


# -- parsing and defaults -------------------------------------------------------------


def test_full_config_is_parsed_and_completed(tmp_path: Path) -> None:
    config = load_text(tmp_path, ADD_SUB, name="add_sub")
    assert config.name == "add_sub"
    assert config.max_batch_size == 8
    assert [i.name for i in config.input] == ["INPUT0", "INPUT1"]
    assert list(config.output[1].reshape.shape) == [2, 2, -1]
    assert config.dynamic_batching.max_queue_delay_microseconds == 100
    assert list(config.dynamic_batching.preferred_batch_size) == [8]
    assert config.version_policy.latest.num_versions == 1
    assert config.default_model_filename == "model.py"
    assert config.optimization.input_pinned_memory.enable
    assert config.optimization.output_pinned_memory.enable


def test_partial_config_gets_name_backend_and_default_instance_group(tmp_path: Path) -> None:
    config = load_text(tmp_path, ONE_IO, name="partial")
    assert config.name == "partial"
    assert config.backend == "python"
    assert len(config.instance_group) == 1
    group = config.instance_group[0]
    # Triton names the group it adds after the model (its instance is "partial_0").
    assert (group.name, group.kind, group.count) == ("partial", KIND.KIND_CPU, 1)


def test_instance_groups_get_names_counts_and_cpu_kind(tmp_path: Path) -> None:
    groups = """
instance_group [ { kind: KIND_AUTO }, { count: 3 kind: KIND_CPU name: "mine" },
                 { count: 0 kind: KIND_MODEL } ]"""
    config = load_text(tmp_path, ONE_IO + groups)
    summary = [(g.name, g.kind, g.count) for g in config.instance_group]
    assert summary == [("m_0", KIND.KIND_CPU, 1), ("mine", KIND.KIND_CPU, 3),
                       ("m_2", KIND.KIND_MODEL, 1)]


def test_preferred_batch_size_stays_empty_without_batching(tmp_path: Path) -> None:
    config = load_text(tmp_path, ONE_IO + "dynamic_batching { }")
    assert list(config.dynamic_batching.preferred_batch_size) == []


def test_sequence_batching_defaults(tmp_path: Path) -> None:
    config = load_text(tmp_path, ONE_IO + "max_batch_size: 4 sequence_batching { oldest { } }")
    assert config.sequence_batching.max_sequence_idle_microseconds == 1_000_000
    assert list(config.sequence_batching.oldest.preferred_batch_size) == [4]


def test_backend_is_inferred_from_default_model_filename(tmp_path: Path) -> None:
    text = ONE_IO + 'default_model_filename: "model.py"'
    config = load_model_config(make_model(tmp_path, "m", text, model_file=None), None)
    assert config.backend == "python"


def test_named_config_is_chosen_and_falls_back(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, "m", ONE_IO)
    (model_dir / "configs").mkdir()
    (model_dir / "configs" / "big.pbtxt").write_text(ONE_IO + "max_batch_size: 32")
    assert load_model_config(model_dir, None, config_name="big").max_batch_size == 32
    assert load_model_config(model_dir, None, config_name="absent").max_batch_size == 0


# -- errors -------------------------------------------------------------------------------


def test_parse_error_names_file_and_line(tmp_path: Path) -> None:
    message = load_error(tmp_path, 'name: "m"\nmax_batch_size: 4\nbogus_field: 1\n')
    assert "config.pbtxt" in message
    assert "line 3" in message
    assert "bogus_field" in message


def test_name_must_equal_directory(tmp_path: Path) -> None:
    message = load_error(tmp_path, 'name: "other"\n' + ONE_IO, name="m")
    assert "unexpected directory name 'm' for model 'other'" in message
    assert "config.pbtxt" in message


@pytest.mark.parametrize(
    ("tensors", "expected"),
    [
        ('input [ { name: "A" dims: [ 1 ] } ]', "model input 'A' must specify 'data_type'"),
        ('output [ { name: "B" data_type: TYPE_INVALID dims: [ 1 ] } ]',
         "model output 'B' must specify 'data_type'"),
        ('input [ { name: "A" data_type: TYPE_FP32 dims: [ 0 ] } ]', "dimension must be integer"),
        ('input [ { name: "A" data_type: TYPE_FP32 dims: [ -2 ] } ]', "dimension must be integer"),
        ('input [ { name: "A" data_type: TYPE_FP32 } ]', "must specify 'dims'"),
        ('input [ { data_type: TYPE_FP32 dims: [ 1 ] } ]', "model input must specify 'name'"),
        ('input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 0 ] } } ]',
         "reshape dimensions must be integer"),
        ('input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 3 ] } } ]',
         "has different size for dims and reshape"),
        ('input [ { name: "A" data_type: TYPE_FP32 dims: [ 2 ] reshape { shape: [ ] } } ]',
         "cannot have empty reshape for non-batching model"),
        ('input [ { name: "A" data_type: TYPE_FP32 dims: [ -1 ] reshape { shape: [ -1, -1 ] } } ]',
         "different number of variable-size dimensions"),
        ('input [ { name: "A" data_type: TYPE_FP32 dims: [ 1 ] },'
         ' { name: "A" data_type: TYPE_FP32 dims: [ 1 ] } ]',
         "model input 'A' is declared more than once"),
        ('output [ { name: "B" data_type: TYPE_FP32 dims: [ 1 ] },'
         ' { name: "B" data_type: TYPE_INT8 dims: [ 1 ] } ]',
         "model output 'B' is declared more than once"),
    ],
)
def test_bad_tensors_are_rejected(tmp_path: Path, tensors: str, expected: str) -> None:
    message = load_error(tmp_path, tensors)
    assert expected in message
    assert "for m" in message


def test_valid_reshapes_are_accepted(tmp_path: Path) -> None:
    tensors = """
max_batch_size: 2
input [ { name: "A" data_type: TYPE_FP32 dims: [ 1 ] reshape { shape: [ ] } },
        { name: "B" data_type: TYPE_FP32 dims: [ 2, 4, -1, 6 ]
          reshape { shape: [ 8, -1, 1, 6 ] } } ]
"""
    inputs, _ = tensor_specs(load_text(tmp_path, tensors))
    assert inputs["A"].reshape == ()
    assert inputs["B"].reshape == (8, -1, 1, 6)


def test_zero_inputs_and_outputs_are_allowed(tmp_path: Path) -> None:
    config = load_text(tmp_path, "")
    assert (len(config.input), len(config.output)) == (0, 0)


def test_negative_max_batch_size(tmp_path: Path) -> None:
    assert "'max_batch_size' must be non-negative" in load_error(tmp_path, "max_batch_size: -1")


def test_preferred_batch_size_above_max_is_rejected(tmp_path: Path) -> None:
    text = ONE_IO + "max_batch_size: 4 dynamic_batching { preferred_batch_size: [ 8 ] }"
    assert "preferred size must be <= max batch size" in load_error(tmp_path, text)


def test_priority_levels_need_a_default_in_range(tmp_path: Path) -> None:
    text = ONE_IO + "dynamic_batching { priority_levels: 2 }"
    assert "default priority level must be in range [1, 2]" in load_error(tmp_path, text)


def test_decoupled_with_dynamic_batching_is_allowed(tmp_path: Path) -> None:
    text = (ONE_IO + "max_batch_size: 4 dynamic_batching { }"
            " model_transaction_policy { decoupled: true }")
    assert load_text(tmp_path, text).model_transaction_policy.decoupled


def test_decoupled_with_response_cache_is_rejected(tmp_path: Path) -> None:
    text = ONE_IO + "model_transaction_policy { decoupled: true } response_cache { enable: true }"
    assert "Response Cache does not currently support" in load_error(tmp_path, text)


@pytest.mark.parametrize(
    ("groups", "expected"),
    [
        ("instance_group [ { kind: KIND_GPU } ]",
         "instance group m_0 of model m: KIND_GPU requested but no GPU is available"),
        ("instance_group [ { kind: KIND_GPU gpus: [ 0 ] } ]", "KIND_GPU requested but no GPU"),
        ("instance_group [ { kind: KIND_CPU gpus: [ 0 ] } ]",
         "has kind KIND_CPU but specifies one or more GPUs"),
        ("instance_group [ { gpus: [ 1 ] } ]", "has kind KIND_CPU but specifies one or more GPUs"),
    ],
)
def test_gpu_requests_are_rejected(tmp_path: Path, groups: str, expected: str) -> None:
    assert expected in load_error(tmp_path, ONE_IO + groups)


@pytest.mark.parametrize(
    ("text", "model_file", "expected"),
    [
        ('backend: "onnxruntime"', "model.onnx",
         "backend 'onnxruntime' is not supported by tritium; only python"),
        ('platform: "onnxruntime_onnx"', "model.onnx", "platform 'onnxruntime_onnx'"),
        ("", None, "must specify 'platform' or 'backend'"),
        ('platform: "ensemble"', None,
         "ensemble scheduling must be set for ensemble m whose platform is ensemble"),
    ],
)
def test_unsupported_backends_are_rejected(
    tmp_path: Path, text: str, model_file: str | None, expected: str
) -> None:
    with pytest.raises(ConfigError, match=expected):
        load_model_config(make_model(tmp_path, "m", text, model_file=model_file), None)


def test_missing_config_without_auto_complete_is_an_error(tmp_path: Path) -> None:
    message = load_error(tmp_path, None)
    assert "no configuration file" in message and "auto-complete is disabled" in message


# -- auto-complete --------------------------------------------------------------------------


class Recorder:
    """An AutoComplete that records its call and applies ``change`` to a copy."""

    def __init__(self, change: Any) -> None:
        self.change = change
        self.calls: list[tuple[Path, Any]] = []

    def __call__(self, model_dir: Path, config: Any) -> Any:
        self.calls.append((model_dir, config))
        completed = pb.ModelConfig()
        completed.CopyFrom(config)
        self.change(completed)
        return completed


def _add_io(config: Any) -> None:
    config.max_batch_size = 4
    config.input.add(name="IN", data_type=pb.TYPE_FP32, dims=[3])
    config.output.add(name="OUT", data_type=pb.TYPE_FP32, dims=[3])
    config.dynamic_batching.SetInParent()
    config.model_transaction_policy.decoupled = True
    config.instance_group[0].count = 7  # not a field auto-complete may change


def test_auto_complete_fills_a_missing_config(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, "auto", None)
    recorder = Recorder(_add_io)
    config = load_model_config(model_dir, recorder)
    assert len(recorder.calls) == 1
    called_dir, seen = recorder.calls[0]
    assert called_dir == model_dir
    assert seen.name == "auto" and seen.backend == "python"
    assert seen.instance_group[0].kind == KIND.KIND_CPU
    assert [i.name for i in config.input] == ["IN"]
    assert list(config.dynamic_batching.preferred_batch_size) == [4]
    assert config.model_transaction_policy.decoupled
    assert config.instance_group[0].count == 1


def test_auto_complete_result_is_validated(tmp_path: Path) -> None:
    def bad_dims(config: Any) -> None:
        config.input.add(name="IN", data_type=pb.TYPE_FP32, dims=[0])

    with pytest.raises(ConfigError, match="model input 'IN' dimension must be integer"):
        load_model_config(make_model(tmp_path, "m", ""), Recorder(bad_dims))


def test_auto_complete_failure_becomes_config_error(tmp_path: Path) -> None:
    def boom(model_dir: Path, config: Any) -> Any:
        raise ValueError("set_max_batch_size: larger value already set")

    with pytest.raises(ConfigError, match="auto-complete of model 'm' failed: set_max"):
        load_model_config(make_model(tmp_path, "m", ""), boom)


def test_auto_complete_is_not_called_for_an_unsupported_backend(tmp_path: Path) -> None:
    recorder = Recorder(_add_io)
    model_dir = make_model(tmp_path, "m", 'backend: "onnxruntime"', model_file="model.onnx")
    with pytest.raises(ConfigError, match="not supported by tritium"):
        load_model_config(model_dir, recorder)
    assert recorder.calls == []


def test_complete_model_config_leaves_its_input_alone(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, "m", None)
    original = pb.ModelConfig(max_batch_size=2)
    completed = complete_model_config(model_dir, original, None)
    assert completed.name == "m" and not original.name


def test_validate_model_config_on_a_hand_built_config() -> None:
    config = pb.ModelConfig(name="x", backend="python")
    config.instance_group.add(name="x", kind=KIND.KIND_CPU, count=1)
    validate_model_config(config)
    config.input.add(name="A", data_type=pb.TYPE_BF16, dims=[-1])
    validate_model_config(config)
    config.input.add(name="A", data_type=pb.TYPE_BF16, dims=[-1])
    with pytest.raises(ConfigError, match="declared more than once"):
        validate_model_config(config)


def test_tensor_specs_follow_config_order(tmp_path: Path) -> None:
    inputs, outputs = tensor_specs(load_text(tmp_path, ADD_SUB, name="add_sub"))
    assert list(inputs) == ["INPUT0", "INPUT1"]
    assert inputs["INPUT0"] == TensorSpec("INPUT0", DataType.FP32, (16,), False, None)
    assert inputs["INPUT1"].optional
    assert outputs["OUTPUT1"] == TensorSpec("OUTPUT1", DataType.BYTES, (4, -1), False, (2, 2, -1))


@pytest.mark.parametrize(
    "sequence",
    ['state [{ input_name: "IN_STATE" output_name: "OUT_STATE" data_type: TYPE_FP32 '
     "dims: [1] }]",
     "iterative_sequence: true"],
)
def test_implicit_state_and_iterative_sequences_pass_validation(tmp_path: Path,
                                                                sequence: str) -> None:
    from google.protobuf import text_format

    from tritium.repository.validation import validate_model_config

    config = pb.ModelConfig()
    text_format.Parse(
        'name: "m" backend: "python" max_batch_size: 1 '
        'input [{ name: "X" data_type: TYPE_FP32 dims: [1] }] '
        'output [{ name: "Y" data_type: TYPE_FP32 dims: [1] }] '
        f"sequence_batching {{ {sequence} }} instance_group [{{ count: 1 kind: KIND_CPU }}]",
        config,
    )
    validate_model_config(config)  # served since the sequence scheduler has both


RAGGED_IO = ('max_batch_size: 8\n'
             'input [ { name: "A" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]\n'
             'output [ { name: "B" data_type: TYPE_FP32 dims: [ -1 ] } ]\n')


@pytest.mark.parametrize(
    ("batch_io", "expected"),
    [
        ('batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "N" data_type: TYPE_INT32 } ]',
         "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 0 for m"),
        ('batch_input [ { kind: BATCH_ITEM_SHAPE target_name: "N" data_type: TYPE_INT64 '
         'source_input: "A" } ]', "batch input data type must be TYPE_INT32 or TYPE_FP32 for m"),
        ('batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "N" '
         'data_type: TYPE_FP32 source_input: "X" } ]', "unknown source input name 'X' for m"),
        ('batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: [ "B", "B" ] '
         'source_input: "A" } ]', "target output name 'B' can only be specified once for m"),
        ('batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "Z" '
         'source_input: "A" } ]', "unknown target output name 'Z' for m"),
    ],
)
def test_batch_inputs_and_outputs_are_checked_as_triton_checks_them(
        tmp_path: Path, batch_io: str, expected: str) -> None:
    assert load_error(tmp_path, RAGGED_IO + batch_io).startswith(expected)


def test_a_valid_batch_input_is_accepted(tmp_path: Path) -> None:
    config = load_text(tmp_path, RAGGED_IO + (
        'batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: "N" '
        'data_type: TYPE_FP32 source_input: "A" } ]'))
    assert config.input[0].allow_ragged_batch and len(config.batch_input) == 1
