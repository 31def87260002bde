"""triton_python_backend_utils: tensors, responses, errors, helpers, ModelConfig, Logger."""

from __future__ import annotations

import ctypes
import json
import logging

import ml_dtypes
import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2

import triton_python_backend_utils as pb_utils
from tests.unit.admitted import admit
from tritium.backends.python.request import ReceivedRequest, RequestContext
from tritium.backends.python.response import to_core
from tritium.core.cancellation import CancelReason
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.request import InferenceRequest as CoreRequest
from tritium.core.types import DataType
from tritium.core.types import Tensor as CoreTensor

# -- Tensor ----------------------------------------------------------------------------


def test_numeric_tensor_keeps_the_array() -> None:
    array = np.arange(6, dtype=np.int32).reshape(2, 3)
    tensor = pb_utils.Tensor("x", array)
    assert tensor.as_numpy() is array
    assert (tensor.name(), tensor.shape(), tensor.triton_dtype()) == ("x", [2, 3], 8)
    assert tensor.is_cpu()


def test_non_contiguous_array_is_made_contiguous() -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3).T
    data = pb_utils.Tensor("x", array).as_numpy()
    assert data.flags.c_contiguous
    np.testing.assert_array_equal(data, array)


@pytest.mark.parametrize(
    "array",
    [
        np.array(["ab", b"c"], dtype=np.object_),
        np.array([b"ab", b"c"], dtype=np.bytes_),
        np.array(["ab", "c"]),
    ],
)
def test_text_arrays_become_bytes(array: np.ndarray) -> None:
    tensor = pb_utils.Tensor("s", array)
    assert tensor.triton_dtype() == 13
    assert tensor.as_numpy().dtype == np.object_
    assert tensor.as_numpy().tolist() == [b"ab", b"c"]


def test_unsupported_dtype_raises() -> None:
    with pytest.raises(pb_utils.TritonModelException, match="complex"):
        pb_utils.Tensor("z", np.zeros(2, dtype=np.complex64))


def test_dlpack_round_trip() -> None:
    tensor = pb_utils.Tensor("x", np.arange(4, dtype=np.float64))
    back = pb_utils.Tensor.from_dlpack("y", tensor)
    np.testing.assert_array_equal(back.as_numpy(), [0, 1, 2, 3])
    assert back.name() == "y"


def _bf16(name: str, raw: np.ndarray) -> pb_utils.Tensor:
    return pb_utils.Tensor._wrap(CoreTensor(name, DataType.BF16, raw.shape, raw))


def test_bf16_as_numpy_refuses_as_triton() -> None:
    tensor = _bf16("b", np.array([0x3F80, 0x4000], dtype=np.uint16))
    with pytest.raises(pb_utils.TritonModelException,
                       match="Tensor dtype is BF16 and cannot be converted to NumPy"):
        tensor.as_numpy()


def test_bf16_crosses_dlpack_as_bfloat16() -> None:
    """The capsule says kDLBfloat (code 4, 16 bits) and comes back as BF16, same memory."""
    raw = np.array([[0x3F80, 0x4000, 0xC040]], dtype=np.uint16)  # 1.0, 2.0, -3.0
    tensor = _bf16("b", raw)
    capsule = tensor.to_dlpack()
    pointer = ctypes.pythonapi.PyCapsule_GetPointer(ctypes.py_object(capsule), b"dltensor")
    assert (ctypes.c_uint8 * 2).from_address(pointer + 20)[:] == [4, 16]
    back = pb_utils.Tensor.from_dlpack("c", capsule)
    assert back.triton_dtype() == DataType.BF16.code and back.shape() == [1, 3]
    assert back._core.data.tolist() == raw.tolist()
    assert np.shares_memory(back._core.data, raw)
    again = pb_utils.Tensor.from_dlpack("d", back)  # through __dlpack__ as well
    assert again.triton_dtype() == DataType.BF16.code


def test_uint16_dlpack_stays_uint16() -> None:
    back = pb_utils.Tensor.from_dlpack("u", np.arange(3, dtype=np.uint16))
    assert back.triton_dtype() == DataType.UINT16.code


def test_ml_dtypes_bfloat16_array_makes_a_bf16_tensor() -> None:
    tensor = pb_utils.Tensor("c", np.array([1.0, 2.0], dtype=ml_dtypes.bfloat16))
    assert tensor.triton_dtype() == DataType.BF16.code
    assert tensor._core.data.tolist() == [0x3F80, 0x4000]


# -- responses and errors --------------------------------------------------------------


def test_response_accessors() -> None:
    tensor = pb_utils.Tensor("y", np.ones(1, dtype=np.float32))
    response = pb_utils.InferenceResponse([tensor], parameters={"n": 1, "ok": True, "s": "t"})
    assert response.output_tensors() == [tensor] and not response.has_error()
    assert json.loads(response.parameters()) == {"n": 1, "ok": True, "s": "t"}
    assert pb_utils.get_output_tensor_by_name(response, "y") is tensor
    assert pb_utils.get_output_tensor_by_name(response, "z") is None


def test_response_parameters_are_checked() -> None:
    with pytest.raises(pb_utils.TritonModelException, match="bool/int/str"):
        pb_utils.InferenceResponse(parameters={"f": 1.5})


def test_error_response_to_core() -> None:
    error = pb_utils.TritonError("nope", pb_utils.TritonError.INVALID_ARG)
    core = to_core(pb_utils.InferenceResponse(error=error), {"y"}, final=True)
    assert core.error is not None and core.final
    assert (core.error.code, core.error.message) == (ErrorCode.INVALID_ARG, "nope")


def test_triton_error_codes() -> None:
    error = pb_utils.TritonError("m")
    assert error.code() == pb_utils.TritonError.INTERNAL == 1
    assert error.message() == "m"
    assert pb_utils.TritonError.CANCELLED == 7
    for code in pb_utils.TritonErrorCode:
        assert pb_utils.TritonError("m", code).to_core().code.name == code.name


def test_core_deadline_maps_to_unavailable() -> None:
    error = pb_utils.TritonError.from_core(CancelReason.DEADLINE.to_error())
    assert error.code() == pb_utils.TritonError.UNAVAILABLE


# -- received requests -----------------------------------------------------------------


def received(names: list[str] | None = None) -> ReceivedRequest:
    data = np.arange(3, dtype=np.int64)
    core = CoreRequest("m", {"IN": CoreTensor("IN", DataType.INT64, (3,), data)})
    return ReceivedRequest(admit(core), RequestContext(names or ["B", "A"], decoupled=False))


def test_get_input_tensor_by_name() -> None:
    request = received()
    tensor = pb_utils.get_input_tensor_by_name(request, "IN")
    assert tensor is not None and tensor.as_numpy() is request._core.inputs["IN"].data
    assert pb_utils.get_input_tensor_by_name(request, "OTHER") is None
    assert [t.name() for t in request.inputs()] == ["IN"]


def test_requested_output_names_default_to_config_outputs() -> None:
    assert received(["B", "A"]).requested_output_names() == ["A", "B"]


def test_is_cancelled_reads_the_core_flag() -> None:
    request = received()
    sender = request.get_response_sender()
    assert not request.is_cancelled() and not sender.is_cancelled()
    request._admitted.cancellation.cancel(CancelReason.CLIENT_DISCONNECTED)
    assert request.is_cancelled() and sender.is_cancelled()


def test_sender_argument_errors() -> None:
    sender = received().get_response_sender()
    with pytest.raises(pb_utils.TritonModelException, match="Unsupported flag"):
        sender.send(pb_utils.InferenceResponse(), flags=4)
    with pytest.raises(pb_utils.TritonModelException, match="must be provided"):
        sender.send(None, flags=0)
    with pytest.raises(pb_utils.TritonModelException, match="complete final before"):
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def test_bls_request_requires_triton_arguments() -> None:
    with pytest.raises(TypeError):
        pb_utils.InferenceRequest(model_name="m")
    with pytest.raises(pb_utils.TritonModelException, match="Correlation ID"):
        pb_utils.InferenceRequest(
            inputs=[],
            requested_output_names=[],
            model_name="m",
            correlation_id=1.5,  # type: ignore[arg-type]
        )
    request = pb_utils.InferenceRequest(
        inputs=[], requested_output_names=["a"], model_name="m", parameters={"k": "v"}
    )
    assert request.requested_output_names() == ["a"] and request.model_name() == "m"
    assert json.loads(request.parameters()) == {"k": "v"}


# -- helpers ---------------------------------------------------------------------------


def test_type_helpers() -> None:
    assert pb_utils.triton_string_to_numpy("TYPE_FP16") is np.float16
    assert pb_utils.triton_string_to_numpy("TYPE_BOOL") is bool
    assert pb_utils.triton_to_numpy_type(1) is np.bool_
    assert pb_utils.triton_to_numpy_type(13) is np.object_
    assert pb_utils.triton_to_numpy_type(14) is None
    assert pb_utils.numpy_to_triton_type(np.float32) == 11
    assert pb_utils.numpy_to_triton_type(np.object_) == 13
    assert pb_utils.numpy_to_triton_type(np.bytes_) == 13
    assert pb_utils.numpy_to_triton_type(np.complex64) is None


def test_serialize_and_deserialize_bytes() -> None:
    encoded = pb_utils.serialize_byte_tensor(np.array([[b"ab"], ["\u00e9"]], dtype=np.object_))
    assert encoded == b"\x02\x00\x00\x00ab\x02\x00\x00\x00\xc3\xa9"
    assert pb_utils.deserialize_bytes_tensor(encoded).tolist() == [b"ab", b"\xc3\xa9"]
    assert pb_utils.serialize_byte_tensor(np.array([], dtype=np.object_)) == ()
    assert pb_utils.serialize_byte_tensor(np.zeros(2)) is None


def test_config_helpers() -> None:
    config = {
        "input": [{"name": "a"}],
        "output": [{"name": "b"}],
        "model_transaction_policy": {"decoupled": True},
    }
    assert pb_utils.get_input_config_by_name(config, "a") == {"name": "a"}
    assert pb_utils.get_output_config_by_name(config, "b") == {"name": "b"}
    assert pb_utils.get_input_config_by_name(config, "b") is None
    assert pb_utils.using_decoupled_model_transaction_policy(config)
    assert not pb_utils.using_decoupled_model_transaction_policy({})


def test_constants() -> None:
    assert pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START == 1
    assert pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END == 2
    assert pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL == 1
    assert pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL == 1
    assert pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE == 2


def test_logger_uses_python_logging(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="tritium.model"):
        pb_utils.Logger.log_info("hello")
        pb_utils.Logger.log("careful", pb_utils.Logger.WARNING)
        pb_utils.Logger.log_verbose("detail")
    assert [(r.name, r.levelno, r.message) for r in caplog.records] == [
        ("tritium.model", logging.INFO, "hello"),
        ("tritium.model", logging.WARNING, "careful"),
        ("tritium.model", logging.DEBUG, "detail"),
    ]


def test_metric_family_stub() -> None:
    family = pb_utils.MetricFamily("requests_total", "requests", pb_utils.MetricFamily.COUNTER)
    metric = family.Metric(labels={"model": "m"})
    metric.increment(2)
    assert metric.value() == 2
    with pytest.raises(pb_utils.TritonModelException, match="does not support Set"):
        metric.set(1)


def test_model_control_checks_its_arguments_first() -> None:
    """Triton's LoadModel wants a dict of files, IsModelReady an integer version string
    (GetModelVersionFromString); both are refused before the server is asked."""
    with pytest.raises(pb_utils.TritonModelException,
                       match="failed to load model 'm', files should be a dictionary"):
        pb_utils.load_model("m", "{}", files=["file:1/model.py"])  # type: ignore[arg-type]
    with pytest.raises(pb_utils.TritonModelException,
                       match=r"^Failed to check model readiness: .*'-1', version should be"):
        pb_utils.is_model_ready("m", "-1")
    with pytest.raises(pb_utils.TritonModelException, match="'v1' \\(details: "):
        pb_utils.is_model_ready("m", "v1")
    with pytest.raises(TypeError):
        pb_utils.unload_model(None)  # type: ignore[arg-type]


# -- ModelConfig -----------------------------------------------------------------------


def model_config(**fields: object) -> pb_utils.ModelConfig:
    config = model_config_pb2.ModelConfig(name="m", **fields)
    return pb_utils.ModelConfig(config)


def test_model_config_dict_has_triton_shape() -> None:
    config = model_config_pb2.ModelConfig(name="m")
    config.input.add(name="x", data_type=model_config_pb2.TYPE_FP32, dims=[-1, 3])
    printed = pb_utils.ModelConfig(config).as_dict()
    assert printed["input"][0]["dims"] == [-1, 3]
    assert printed["max_batch_size"] == 0 and printed["output"] == []
    assert "dynamic_batching" not in printed


def test_model_config_edits_round_trip() -> None:
    config = model_config(max_batch_size=4)
    config.set_max_batch_size(16)
    config.add_input({"name": "x", "data_type": "TYPE_INT32", "dims": [2], "optional": True})
    config.add_output({"name": "y", "data_type": "TYPE_FP32", "dims": [-1]})
    config.as_dict()["parameters"] = {"k": {"string_value": "v"}}  # live dict, as in Triton
    proto = config.to_protobuf()
    assert proto.max_batch_size == 16
    assert proto.input[0].optional and list(proto.input[0].dims) == [2]
    assert proto.output[0].name == "y"
    assert proto.parameters["k"].string_value == "v"


def test_model_config_fills_in_a_declared_tensor() -> None:
    config = model_config()
    config.as_dict()["input"] = [{"name": "x", "data_type": "TYPE_INVALID", "dims": []}]
    config.add_input({"name": "x", "data_type": "TYPE_FP32", "dims": [3]})
    assert config.as_dict()["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [3]}]


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        (lambda c: c.set_max_batch_size(2), "configuration specified max_batch_size 4"),
        (lambda c: c.add_input({"name": "x", "dims": [1]}), "missing 'data_type'"),
        (
            lambda c: c.add_input({"name": "x", "data_type": "TYPE_FP32", "dims": [1], "z": 1}),
            "contains property other than",
        ),
        (
            lambda c: c.add_output(
                {"name": "x", "data_type": "TYPE_FP32", "dims": [1], "optional": True}
            ),
            "contains property other than",
        ),
        (lambda c: c.set_model_transaction_policy({"streaming": True}), "other than 'decoupled'"),
    ],
)
def test_model_config_errors(action: object, expected: str) -> None:
    config = model_config(max_batch_size=4)
    with pytest.raises(ValueError, match=expected):
        action(config)  # type: ignore[operator]


def test_model_config_dims_conflict() -> None:
    config = model_config()
    config.add_input({"name": "x", "data_type": "TYPE_FP32", "dims": [3]})
    with pytest.raises(ValueError, match="the model expects dims"):
        config.add_input({"name": "x", "data_type": "TYPE_FP32", "dims": [4]})


def test_dynamic_batching_refused_with_sequence_batching() -> None:
    config = model_config(sequence_batching=model_config_pb2.ModelSequenceBatching())
    with pytest.raises(ValueError, match="sequence_batching"):
        config.set_dynamic_batching()


def test_decoupled_cannot_be_flipped() -> None:
    config = model_config()
    config.set_model_transaction_policy({"decoupled": True})
    with pytest.raises(ValueError, match="trying to change decoupled"):
        config.set_model_transaction_policy({"decoupled": False})


def test_invalid_edit_is_invalid_arg() -> None:
    config = model_config()
    config.as_dict()["input"] = [{"name": "x", "data_type": "TYPE_NOPE", "dims": [1]}]
    with pytest.raises(TritiumError) as caught:
        config.to_protobuf()
    assert caught.value.code is ErrorCode.INVALID_ARG


def test_dlpack_data_the_cpu_cannot_read_is_a_model_exception() -> None:
    """A capsule saying kDLCUDA (device type 2) is refused in tritium's words, not numpy's."""
    capsule = np.zeros(3, np.float32).__dlpack__()
    pointer = ctypes.pythonapi.PyCapsule_GetPointer(ctypes.py_object(capsule), b"dltensor")
    ctypes.c_int32.from_address(pointer + 8).value = 2
    with pytest.raises(pb_utils.TritonModelException, match="keeps tensors in CPU memory"):
        pb_utils.Tensor.from_dlpack("g", capsule)
    ctypes.c_int32.from_address(pointer + 8).value = 1  # the deleter frees it as it was
