"""Warmup samples made from a config: shapes, data, and the samples Triton refuses."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from tritium.core.errors import TritiumError
from tritium.core.types import DataType
from tritium.repository.warmup import warmup_samples


def _config(text: str) -> pb.ModelConfig:
    return text_format.Parse(text, pb.ModelConfig())


def _sample(inputs: str, batch_size: int = 1, count: int = 0, max_batch_size: int = 0) -> str:
    return (f"max_batch_size: {max_batch_size}\n"
            f'model_warmup [{{ name: "s" batch_size: {batch_size} count: {count} {inputs} }}]')


def _input(name: str, data_type: str, dims: str, data: str) -> str:
    return f'inputs {{ key: "{name}" value {{ data_type: {data_type} dims: [{dims}] {data} }} }}'


def test_shapes_follow_batching_and_count_zero_runs_once(tmp_path: Path) -> None:
    zero = _input("X", "TYPE_INT16", "2, 3", "zero_data: true")
    (plain,) = warmup_samples(_config(_sample(zero)), tmp_path)
    (batched,) = warmup_samples(_config(_sample(zero, batch_size=4, count=3,
                                                max_batch_size=8)), tmp_path)
    assert plain.inputs["X"].shape == (2, 3) and plain.count == 1 and plain.batch_size == 1
    assert batched.inputs["X"].shape == (1, 2, 3) and batched.count == 3
    assert batched.inputs["X"].datatype is DataType.INT16
    assert not batched.inputs["X"].data.any()


def test_random_data_of_every_numeric_type(tmp_path: Path) -> None:
    for data_type in ("TYPE_BOOL", "TYPE_UINT8", "TYPE_INT64", "TYPE_FP16", "TYPE_FP64"):
        (sample,) = warmup_samples(
            _config(_sample(_input("X", data_type, "5", "random_data: true"))), tmp_path)
        tensor = sample.inputs["X"]
        assert tensor.shape == (5,) and tensor.data.dtype == tensor.datatype.numpy


def test_batch_size_zero_is_skipped(tmp_path: Path) -> None:
    text = _sample(_input("X", "TYPE_FP32", "1", "zero_data: true"), batch_size=0)
    assert warmup_samples(_config(text), tmp_path) == []


@pytest.mark.parametrize(("inputs", "files", "message"), [
    (_input("X", "TYPE_FP32", "-1", "zero_data: true"), {},
     "warmup setting expects all variable-size dimensions are specified for input 'X'"),
    (_input("X", "TYPE_FP32", "2", ""), {},
     "warmup setting expects input 'X' to have input_data_type set"),
    (_input("X", "TYPE_FP32", "2", 'input_data_file: "short"'), {"short": b"\0" * 7},
     "warmup setting expects 8 bytes, but the data provided from shortonly has 7 bytes"),
    (_input("X", "TYPE_FP32", "2", 'input_data_file: "absent"'), {},
     "failed to read warmup data file 'absent' for input 'X'"),
    (_input("X", "TYPE_FP32", "2", 'input_data_file: "../config.pbtxt"'), {},
     "is outside the model's 'warmup' folder"),
    (_input("X", "TYPE_STRING", "2", 'input_data_file: "one"'), {"one": b"\1\0\0\0a"},
     "expected 2 string elements"),
])
def test_samples_triton_refuses(tmp_path: Path, inputs: str, files: dict[str, bytes],
                                message: str) -> None:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "config.pbtxt").write_text("")
    for name, data in files.items():
        (tmp_path / "warmup" / name).write_bytes(data)
    with pytest.raises(TritiumError) as caught:
        warmup_samples(_config(_sample(inputs)), tmp_path)
    assert message in caught.value.message


def test_data_files_are_read_from_the_warmup_folder(tmp_path: Path) -> None:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "raw").write_bytes(np.arange(4, dtype=np.int32).tobytes())
    (sample,) = warmup_samples(
        _config(_sample(_input("X", "TYPE_INT32", "3", 'input_data_file: "raw"'))), tmp_path)
    assert sample.inputs["X"].data.tolist() == [0, 1, 2]
