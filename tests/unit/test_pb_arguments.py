"""pb_utils constructors and Logger.log refuse arguments as Triton's pybind11 bindings do:
TypeError where an argument does not convert to the C++ type of the signature, and
TritonModelException (with Triton's text) for what Triton's own code checks afterwards."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

import triton_python_backend_utils as pb_utils

DATA = np.zeros(2, np.float32)


def request(**overrides: Any) -> Any:
    arguments: dict[str, Any] = {"model_name": "m", "inputs": [pb_utils.Tensor("X", DATA)],
                                 "requested_output_names": ["Y"]}
    return pb_utils.InferenceRequest(**{**arguments, **overrides})


def test_valid_request_arguments_convert_as_pybind11_converts_them() -> None:
    made = request(model_name=b"m", request_id=b"r", requested_output_names=(b"Y", "Z"),
                   model_version=np.int64(2), flags=True, timeout=0, correlation_id="seq")
    assert (made.model_name(), made.request_id(), made.requested_output_names()) == (
        "m", "r", ["Y", "Z"])
    assert (made.flags(), made.correlation_id()) == (1, "seq")


@pytest.mark.parametrize("overrides", [
    {"model_name": None}, {"model_name": 5}, {"request_id": None}, {"request_id": 1},
    {"inputs": None}, {"inputs": [DATA]}, {"inputs": "X"},
    {"requested_output_names": None}, {"requested_output_names": "Y"},
    {"requested_output_names": [1]},
    {"correlation_id": None},
    {"model_version": 1.0}, {"model_version": "1"}, {"model_version": 1 << 63},
    {"flags": -1}, {"flags": 1 << 32}, {"timeout": -1}, {"timeout": 0.5},
    {"preferred_memory": "cpu"}, {"trace": 1},
])
def test_request_arguments_of_the_wrong_type_are_type_errors(overrides: dict[str, Any]) -> None:
    """pb_stub.cc binds InferenceRequest's arguments as std::string, int64_t, uint32_t,
    uint64_t and std::vector of Tensor / std::string, each ``none(false)``."""
    with pytest.raises(TypeError):
        request(**overrides)


def test_request_checks_of_tritons_own_code() -> None:
    """"Correlation ID must be integer or string" (pb_stub.cc); the parameters must be a
    dict of str to bool/int/str (PyDefaultArgumentToMutableType, PyParametersToJSON)."""
    with pytest.raises(pb_utils.TritonModelException) as refused:
        request(correlation_id=1.5)
    assert str(refused.value) == "Correlation ID must be integer or string"
    with pytest.raises(RuntimeError, match="Unable to cast Python instance"):
        request(correlation_id=-1)
    with pytest.raises(pb_utils.TritonModelException) as caught:
        request(parameters=[("a", 1)])
    assert str(caught.value) == "Expect N8pybind114dictE, got <class 'list'>"
    with pytest.raises(pb_utils.TritonModelException) as caught:
        request(parameters={"a": 1.5})
    assert str(caught.value) == ("Expect parameters values to have type bool/int/str, found "
                                 "type <class 'float'>")
    with pytest.raises(pb_utils.TritonModelException) as caught:
        pb_utils.InferenceResponse(parameters={1: "a"})  # type: ignore[dict-item]
    assert str(caught.value) == ("Expect parameters keys to have type str, found type "
                                 "<class 'int'>")


def test_tensor_arguments() -> None:
    """Tensor(name: std::string, data: py::array): pybind11 loads a py::array only from an
    ndarray; an empty name is refused by PbTensor itself, after the conversions."""
    assert pb_utils.Tensor(b"X", DATA).name() == "X"
    for name in (None, 3):
        with pytest.raises(TypeError):
            pb_utils.Tensor(name, DATA)  # type: ignore[arg-type]
    for data in (None, [1, 2], np.float32(1), 3):
        with pytest.raises(TypeError):
            pb_utils.Tensor("X", data)
    with pytest.raises(TypeError):
        pb_utils.Tensor("", None)
    with pytest.raises(pb_utils.TritonModelException) as refused:
        pb_utils.Tensor("", DATA)
    assert str(refused.value) == "Tensor name cannot be an empty string."


def test_from_dlpack_refuses_with_tritons_text() -> None:
    """The name is checked first, then what the object offers (pb_tensor.cc FromDLPack)."""
    with pytest.raises(pb_utils.TritonModelException) as refused:
        pb_utils.Tensor.from_dlpack("", None)
    assert str(refused.value) == "Tensor name cannot be an empty string."
    for source in (None, [1, 2], DATA.tolist()):
        with pytest.raises(pb_utils.TritonModelException, match="Provided tensor is not"):
            pb_utils.Tensor.from_dlpack("X", source)


def test_a_none_in_a_list_of_tensors_is_refused_by_triton_code() -> None:
    """pybind11 converts a None element to an empty pointer; Triton's constructors refuse
    it with TritonModelException, and an empty requested output name likewise."""
    with pytest.raises(pb_utils.TritonModelException) as refused:
        request(inputs=[None], request_id="r7")
    assert str(refused.value) == ("Input tensor for request with id 'r7' and model name 'm' "
                                  "should not be empty.")
    with pytest.raises(pb_utils.TritonModelException) as refused:
        request(requested_output_names=[""])
    assert str(refused.value) == ("Requested output name for request with id '' and model "
                                  "name 'm' should not be empty.")
    with pytest.raises(TypeError):
        request(inputs=[None], model_name=None)  # conversions come first
    with pytest.raises(pb_utils.TritonModelException) as refused:
        pb_utils.InferenceResponse(output_tensors=[None])  # type: ignore[list-item]
    assert str(refused.value) == "Output tensor for inference response should not be empty."
    assert request(inputs=[], requested_output_names=[]).inputs() == []
    assert request(correlation_id=5).correlation_id() == 5


def test_response_arguments() -> None:
    """InferenceResponse(output_tensors: std::vector<Tensor> = [], error: TritonError or
    None): None is no vector, and only Tensors and a TritonError convert."""
    assert pb_utils.InferenceResponse().output_tensors() == []
    assert pb_utils.InferenceResponse(error=None).has_error() is False
    for arguments in ({"output_tensors": None}, {"output_tensors": [DATA]},
                      {"output_tensors": pb_utils.Tensor("X", DATA)},
                      {"error": "failed"}, {"error": pb_utils.TritonModelException("x")}):
        with pytest.raises(TypeError):
            pb_utils.InferenceResponse(**arguments)


def test_response_outputs_of_any_sequence_or_tensor_subclass_are_copied_into_a_list() -> None:
    """A list of exactly Tensors is checked by type alone; a tuple, or a Tensor subclass,
    takes the full check and converts the same way."""

    class Named(pb_utils.Tensor):
        __slots__ = ()

    tensor, subclassed = pb_utils.Tensor("X", DATA), Named("Y", DATA)
    given = [tensor]
    response = pb_utils.InferenceResponse(given)
    given.append(tensor)
    assert response.output_tensors() == [tensor]
    pair = pb_utils.InferenceResponse((tensor, subclassed))  # type: ignore[arg-type]
    assert pair.output_tensors() == [tensor, subclassed]
    assert pb_utils.InferenceResponse([subclassed]).output_tensors() == [subclassed]


def test_a_tensor_name_of_a_str_subclass_is_kept_as_a_str() -> None:
    class Text(str):
        pass

    name = pb_utils.Tensor(Text("X"), DATA).name()
    assert (name, type(name)) == ("X", str)


def test_logger_arguments(caplog: pytest.LogCaptureFixture) -> None:
    """Logger.log(message: std::string, level: LogLevel): a plain int is no pybind11 enum
    value, and a message must be text."""
    with caplog.at_level(logging.INFO, logger="tritium.model"):
        pb_utils.Logger.log(b"hello", pb_utils.Logger.WARNING)  # type: ignore[arg-type]
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [(logging.WARNING, "hello")]
    for call in (lambda: pb_utils.Logger.log("x", 1), lambda: pb_utils.Logger.log(5),  # type: ignore[arg-type]
                 lambda: pb_utils.Logger.log_info(None), lambda: pb_utils.Logger.log_warn(1.0)):  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            call()
