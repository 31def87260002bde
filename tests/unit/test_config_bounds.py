"""Configs that would allocate without limit are refused, with the field named, before any
model code runs."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as pb

from tritium.repository.config import ConfigError, prepare_model_config
from tritium.repository.validation import (
    MAX_DIMS,
    MAX_INSTANCES,
    MAX_PREFERRED_BATCH_SIZES,
    MAX_PRIORITY_LEVELS,
    validate_model_config,
)

BASE: dict[str, Any] = {
    "backend": "python",
    "max_batch_size": 8,
    "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [1]}],
    "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [1]}],
}


def prepared(tmp_path: Path, **fields: Any) -> Any:
    (tmp_path / "m" / "1").mkdir(parents=True, exist_ok=True)
    config = json_format.ParseDict({**BASE, **fields}, pb.ModelConfig())
    return prepare_model_config(tmp_path / "m", config)


def refusal(tmp_path: Path, **fields: Any) -> str:
    started = time.monotonic()
    with pytest.raises(ConfigError) as caught:
        prepared(tmp_path, **fields)
    assert time.monotonic() - started < 1.0  # refused up front, nothing built
    return caught.value.message


def test_limits_themselves_are_accepted(tmp_path: Path) -> None:
    config = prepared(
        tmp_path,
        instance_group=[{"count": MAX_INSTANCES // 2}, {"count": MAX_INSTANCES // 2}],
        dynamic_batching={"priority_levels": MAX_PRIORITY_LEVELS,
                          "default_priority_level": 1},
        input=[{"name": "IN", "data_type": "TYPE_FP32", "dims": [1] * MAX_DIMS}],
    )
    assert sum(group.count for group in config.instance_group) == MAX_INSTANCES


def test_too_many_instances(tmp_path: Path) -> None:
    message = refusal(tmp_path, instance_group=[{"count": 100_000, "kind": "KIND_CPU"}])
    assert "'instance_group' count" in message and "100000" in message


def test_instances_add_up_across_groups(tmp_path: Path) -> None:
    groups = [{"count": MAX_INSTANCES // 2 + 1}, {"count": MAX_INSTANCES // 2 + 1}]
    assert "'instance_group' count" in refusal(tmp_path, instance_group=groups)


def test_too_many_priority_levels(tmp_path: Path) -> None:
    message = refusal(tmp_path, dynamic_batching={"priority_levels": 100_000_000,
                                                  "default_priority_level": 1})
    assert "'dynamic_batching.priority_levels'" in message and "100000000" in message


def test_too_many_preferred_batch_sizes(tmp_path: Path) -> None:
    sizes = [1] * (MAX_PREFERRED_BATCH_SIZES + 1)
    message = refusal(tmp_path, dynamic_batching={"preferred_batch_size": sizes})
    assert "'dynamic_batching.preferred_batch_size'" in message


@pytest.mark.parametrize("tensor, field", [
    ({"name": "IN", "data_type": "TYPE_FP32", "dims": [1] * (MAX_DIMS + 1)}, "'dims'"),
    ({"name": "IN", "data_type": "TYPE_FP32", "dims": [-1],
      "reshape": {"shape": [1] * (MAX_DIMS + 1)}}, "'reshape.shape'"),
    ({"name": "IN", "data_type": "TYPE_FP32", "dims": [2**62, 4]}, "overflows int64"),
])
def test_tensor_shapes_are_bounded(tmp_path: Path, tensor: dict[str, Any], field: str) -> None:
    message = refusal(tmp_path, input=[tensor])
    assert "model input 'IN'" in message and field in message


@pytest.mark.parametrize("filename", ["../../../tmp/evil.py", "/tmp/evil.py", "..", "a\\b.py"])
def test_default_model_filename_stays_in_the_version_directory(tmp_path: Path,
                                                               filename: str) -> None:
    message = refusal(tmp_path, default_model_filename=filename)
    assert "'default_model_filename'" in message


def test_one_control_tensor_per_kind(tmp_path: Path) -> None:
    start = {"kind": "CONTROL_SEQUENCE_START", "int32_false_true": [0, 1]}
    batching = {"control_input": [{"name": "S1", "control": [start]},
                                  {"name": "S2", "control": [start]}]}
    config = prepared(tmp_path, sequence_batching=batching)
    with pytest.raises(ConfigError, match="multiple CONTROL_SEQUENCE_START tensors"):
        validate_model_config(config)


def test_a_config_override_of_absurd_size_is_cheap_to_refuse(tmp_path: Path) -> None:
    text = json.dumps({**BASE, "instance_group": [{"count": 2**31 - 1}]})
    config = json_format.Parse(text, pb.ModelConfig())
    with pytest.raises(ConfigError, match="instance_group"):
        prepare_model_config((tmp_path / "m"), config)
