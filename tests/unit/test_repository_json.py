"""ModelConfig ⇄ Triton's JSON form (HTTP /config, the load ``config`` override)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as pb

from tests.unit.test_repository_config import ADD_SUB, make_model
from tritium.repository.config import (
    ConfigError,
    complete_model_config,
    config_to_json,
    json_to_config,
    load_model_config,
)

EVERY_INT64 = """
name: "m"
backend: "python"
max_batch_size: 4
input [ { name: "A" data_type: TYPE_FP32 dims: [ 2, -1 ] reshape { shape: [ 2, -1, 1 ] } } ]
version_policy { specific { versions: [ 1, 3 ] } }
dynamic_batching {
  max_queue_delay_microseconds: 100
  priority_levels: 2
  default_priority_level: 1
  default_queue_policy { default_timeout_microseconds: 7 }
  priority_queue_policy { key: 2 value { default_timeout_microseconds: 9 } }
}
model_warmup [ { name: "w" batch_size: 1
                 inputs { key: "A"
                          value { data_type: TYPE_FP32 dims: [ 2, 5 ] zero_data: true } } } ]
"""


def test_config_json_has_numbers_enum_names_and_every_field(tmp_path: Path) -> None:
    config = load_model_config(make_model(tmp_path, "add_sub", ADD_SUB), None)
    printed = config_to_json(config)
    first = printed["input"][0]
    assert first["dims"] == [16]
    assert first["data_type"] == "TYPE_FP32"
    assert first["optional"] is False  # printed although it is the default
    assert first["format"] == "FORMAT_NONE"
    assert printed["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    assert printed["dynamic_batching"]["preferred_batch_size"] == [8]
    assert printed["instance_group"][0]["kind"] == "KIND_CPU"
    assert printed["version_policy"] == {"latest": {"num_versions": 1}}
    assert printed["platform"] == "" and printed["backend"] == "python"
    assert printed["output"][1]["reshape"] == {"shape": [2, 2, -1]}
    # orjson / json must be able to print it unchanged.
    assert json.loads(json.dumps(printed)) == printed


def test_keys_follow_proto_field_order(tmp_path: Path) -> None:
    config = load_model_config(make_model(tmp_path, "add_sub", ADD_SUB), None)
    printed = config_to_json(config)
    assert list(printed)[:6] == ["name", "platform", "backend", "runtime", "version_policy",
                                 "max_batch_size"]
    assert list(printed["input"][0])[:4] == ["name", "data_type", "format", "dims"]


def test_every_int64_field_triton_fixes_is_a_number(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, "m", EVERY_INT64, versions=("1", "3"))
    printed = config_to_json(load_model_config(model_dir, None))
    assert printed["input"][0]["dims"] == [2, -1]
    assert printed["input"][0]["reshape"]["shape"] == [2, -1, 1]
    assert printed["version_policy"]["specific"]["versions"] == [1, 3]
    batching = printed["dynamic_batching"]
    assert (batching["priority_levels"], batching["default_priority_level"]) == (2, 1)
    assert batching["default_queue_policy"]["default_timeout_microseconds"] == 7
    # Map keys stay strings (JSON allows nothing else); the values are fixed.
    assert batching["priority_queue_policy"]["2"]["default_timeout_microseconds"] == 9
    assert printed["model_warmup"][0]["inputs"]["A"]["dims"] == [2, 5]


def test_sequence_batching_int64_fields_are_numbers(tmp_path: Path) -> None:
    config = pb.ModelConfig(name="s", backend="python", max_batch_size=2)
    batcher = config.sequence_batching
    batcher.direct.max_queue_delay_microseconds = 50
    model_dir = make_model(tmp_path, "s", None)
    completed = complete_model_config(model_dir, config, None)
    # Implicit state is refused at load; its JSON form is still Triton's.
    state = completed.sequence_batching.state.add(input_name="i", output_name="o",
                                                  data_type=pb.TYPE_INT32, dims=[3])
    state.initial_state.add(name="zero", data_type=pb.TYPE_INT32, dims=[3], zero_data=True)
    printed = config_to_json(completed)
    sequence = printed["sequence_batching"]
    assert sequence["max_sequence_idle_microseconds"] == 1_000_000
    assert sequence["direct"]["max_queue_delay_microseconds"] == 50
    assert sequence["state"][0]["dims"] == [3]
    assert sequence["state"][0]["initial_state"][0]["dims"] == [3]


def test_json_round_trip(tmp_path: Path) -> None:
    config = load_model_config(make_model(tmp_path, "add_sub", ADD_SUB), None)
    assert json_to_config(json.dumps(config_to_json(config))) == config


def test_json_override_accepts_numbers_and_strings() -> None:
    text = '{"name": "m", "max_batch_size": 2, "input": [{"name": "A", ' \
           '"data_type": "TYPE_INT8", "dims": [3, "-1"]}]}'
    config = json_to_config(text)
    assert list(config.input[0].dims) == [3, -1]
    assert config.input[0].data_type == pb.TYPE_INT8


@pytest.mark.parametrize(
    "text", ["{not json", '{"no_such_field": 1}', '{"max_batch_size": "many"}', "[]"]
)
def test_bad_json_override_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match="Invalid config override"):
        json_to_config(text)
