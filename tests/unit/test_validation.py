"""The cheap checks that run before a request's data is decoded, without a frontend."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import pytest

from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.model import ModelHandle
from tritium.core.types import DataType, TensorSpec
from tritium.core.validation import MAX_DIMS, check_input, element_count


@dataclass
class Model:
    name: str = "m"
    max_batch_size: int = 4
    inputs: dict[str, TensorSpec] = field(default_factory=lambda: {
        "x": TensorSpec("x", DataType.FP32, (-1, 2))})


MODEL = cast(ModelHandle, Model())


def test_element_count() -> None:
    assert element_count("x", ()) == 1
    assert element_count("x", (2, 3, 4)) == 24
    assert element_count("x", (0, 2**40)) == 0
    assert element_count("x", (1,) * MAX_DIMS) == 1


@pytest.mark.parametrize("shape, message", [
    ((1,) * (MAX_DIMS + 1), "input 'x' has 65 dimensions, more than the 64 allowed"),
    ((2**32, 2**32), "holds more elements than a tensor can"),
    ((0, 2**61, 2**61), "holds more elements than a tensor can"),
])
def test_shapes_no_tensor_can_have(shape: tuple[int, ...], message: str) -> None:
    with pytest.raises(TritiumError, match=message) as info:
        element_count("x", shape, "[request id: r] ")
    assert info.value.code is ErrorCode.INVALID_ARG
    assert info.value.message.startswith("[request id: r] ")


@pytest.mark.parametrize("name, datatype, shape, message", [
    ("y", DataType.FP32, (1, 5, 2), "unexpected inference input 'y' for model 'm'"),
    ("x", DataType.INT32, (1, 5, 2), "data-type is 'INT32', but model 'm' expects 'FP32'"),
    ("x", DataType.FP32, (1, 5, 3), r"Expected \[-1, -1, 2\], got \[1, 5, 3\]"),
    ("x", DataType.FP32, (), "has no batch dimension"),
    ("x", DataType.FP32, (5, 1, 2), "batch-size must be <= 4 for 'm'"),
])
def test_check_input_refuses_what_validation_would(
    name: str, datatype: DataType, shape: tuple[int, ...], message: str
) -> None:
    with pytest.raises(TritiumError, match=message) as info:
        check_input(MODEL, name, datatype, shape, "")
    assert info.value.code is ErrorCode.INVALID_ARG


def test_check_input_accepts_a_fitting_input() -> None:
    check_input(MODEL, "x", DataType.FP32, (4, 7, 2), "")
