"""The cheap checks that run before a request's data is decoded, without a frontend."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import numpy as np
import pytest

from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.model import ModelHandle
from tritium.core.request import InferenceRequest, RequestedOutput
from tritium.core.types import DataType, Tensor, TensorSpec
from tritium.core.validation import MAX_DIMS, check_input, element_count, validate_request


@dataclass
class Model:
    name: str = "m"
    max_batch_size: int = 4
    inputs: dict[str, TensorSpec] = field(default_factory=lambda: {
        "x": TensorSpec("x", DataType.FP32, (-1, 2))})
    outputs: dict[str, TensorSpec] = field(default_factory=lambda: {
        "y": TensorSpec("y", DataType.FP32, (-1,))})


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
        element_count("x", shape, "r")
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
        check_input(MODEL, name, datatype, shape)
    assert info.value.code is ErrorCode.INVALID_ARG


def test_check_input_accepts_a_fitting_input() -> None:
    check_input(MODEL, "x", DataType.FP32, (4, 7, 2))


def test_element_count_names_the_request_only_when_given_one() -> None:
    with pytest.raises(TritiumError) as info:
        element_count("x", (1,) * (MAX_DIMS + 1))
    assert info.value.message.startswith("input 'x' has 65 dimensions")
    with pytest.raises(TritiumError) as info:
        element_count("x", (1,) * (MAX_DIMS + 1), "")
    assert info.value.message.startswith("[request id: <id_unknown>] input 'x'")


def test_fixed_dimensions_must_match_and_wildcards_take_any() -> None:
    model = cast(ModelHandle, Model(inputs={"x": TensorSpec("x", DataType.FP32, (3, -1, 2))}))
    check_input(model, "x", DataType.FP32, (1, 3, 9, 2))
    for shape in ((1, 4, 9, 2), (1, 3, 9, 1), (1, 3, 9), (1, 3, 9, 2, 1)):
        with pytest.raises(TritiumError, match=r"Expected \[-1, 3, -1, 2\]"):
            check_input(model, "x", DataType.FP32, shape)


def request_of(*tensors: Tensor, checked_for: object = None,
               requested_outputs: list[RequestedOutput] | None = None) -> InferenceRequest:
    return InferenceRequest("m", {t.name: t for t in tensors}, id="r",
                            requested_outputs=requested_outputs, checked_for=checked_for)


def tensor(name: str, shape: tuple[int, ...], datatype: DataType = DataType.FP32) -> Tensor:
    return Tensor(name, datatype, shape, np.zeros(shape, datatype.numpy))


def test_a_request_checked_for_another_handle_is_checked_in_full() -> None:
    """The frontend's check counts only for the handle it ran against: after a reload
    swapped versions, the one serving the request checks every input itself."""
    other = cast(ModelHandle, Model())
    bad = request_of(tensor("x", (1, 5, 3)), checked_for=other)
    with pytest.raises(TritiumError, match=r"\[request id: r\] unexpected shape"):
        validate_request(bad, MODEL)
    unknown = request_of(tensor("z", (1, 2)), checked_for=None)
    with pytest.raises(TritiumError, match="unexpected inference input 'z'"):
        validate_request(unknown, MODEL)


def test_a_request_checked_for_this_handle_skips_only_the_per_input_checks() -> None:
    # What check_input covers is trusted (this input would fail it: the frontend vouched).
    trusted = request_of(tensor("x", (1, 5, 3)), checked_for=MODEL)
    assert validate_request(trusted, MODEL) == 1
    # What it does not cover is still checked: outputs, missing inputs, batch agreement.
    outputs = request_of(tensor("x", (2, 5, 2)), checked_for=MODEL,
                         requested_outputs=[RequestedOutput("nope")])
    with pytest.raises(TritiumError, match="unexpected inference output 'nope'"):
        validate_request(outputs, MODEL)
    missing = request_of(checked_for=MODEL)
    with pytest.raises(TritiumError, match="missing"):
        validate_request(missing, MODEL)
    two = cast(ModelHandle, Model(inputs={"a": TensorSpec("a", DataType.FP32, (-1,)),
                                          "b": TensorSpec("b", DataType.FP32, (-1,))}))
    disagree = request_of(tensor("a", (1, 4)), tensor("b", (2, 4)), checked_for=two)
    with pytest.raises(TritiumError, match="must all have the same batch size"):
        validate_request(disagree, two)
    too_big = request_of(tensor("x", (5, 5, 2)), checked_for=MODEL)
    with pytest.raises(TritiumError, match="batch-size must be <= 4"):
        validate_request(too_big, MODEL)


def test_the_frontends_mark_is_trusted_for_one_validation_only() -> None:
    """A request submitted again (its inputs may have changed since) is checked in full."""
    request = request_of(tensor("x", (1, 5, 3)), checked_for=MODEL)
    assert validate_request(request, MODEL) == 1
    assert request.checked_for is None
    with pytest.raises(TritiumError, match="unexpected shape"):
        validate_request(request, MODEL)
