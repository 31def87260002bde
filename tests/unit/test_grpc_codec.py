"""The gRPC codec: protobuf messages in, core objects out, and back, with no server."""

from __future__ import annotations

import asyncio
import dataclasses
import struct
from typing import Any, cast

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.model import (
    IndexEntry,
    ModelHandle,
    ModelMetadata,
    ModelState,
    TensorMetadata,
)
from tritium.core.request import SEQUENCE_END, SEQUENCE_START, InferenceRequest
from tritium.core.response import InferenceResponse, ServedBy
from tritium.core.serialization import split_length_prefixed
from tritium.core.types import DataType, Tensor, TensorSpec
from tritium.frontends.grpc import codec
from tritium.frontends.grpc.parse import parse_message
from tritium.frontends.grpc.status import grpc_status

NUMERIC = [t for t in DataType if t is not DataType.BYTES]
TYPED = [t for t in NUMERIC if t not in (DataType.FP16, DataType.BF16)]


def sample(datatype: DataType) -> np.ndarray:
    if datatype is DataType.BOOL:
        return np.array([True, False, True])
    if datatype is DataType.BF16:
        return np.array([0x3F80, 0x4000, 0xBF80], dtype=np.uint16)
    return np.array([1, 2, 3], dtype=datatype.numpy)


def infer_message(**fields: Any) -> pb.ModelInferRequest:
    return pb.ModelInferRequest(model_name="m", **fields)


def raw_message(datatype: str, shape: list[int], raw: bytes) -> pb.ModelInferRequest:
    message = infer_message(id="r1")
    message.inputs.add(name="INPUT0", datatype=datatype, shape=shape)
    message.raw_input_contents.append(raw)
    return message


def expect_error(code: ErrorCode, message: pb.ModelInferRequest, text: str = "") -> TritiumError:
    with pytest.raises(TritiumError) as info:
        codec.decode_infer_request(message)
    assert info.value.code is code, info.value
    assert text in info.value.message
    return info.value


# ------------------------------------------------------------------------ inputs


@pytest.mark.parametrize("datatype", NUMERIC, ids=lambda t: t.wire)
def test_raw_input_every_numeric_datatype(datatype: DataType) -> None:
    values = sample(datatype)
    request = codec.decode_infer_request(raw_message(datatype.wire, [3], values.tobytes()))
    tensor = request.inputs["INPUT0"]
    assert tensor.datatype is datatype
    assert tensor.shape == (3,)
    assert tensor.data.dtype == datatype.numpy
    np.testing.assert_array_equal(tensor.data, values)


def test_raw_input_is_a_view_and_keeps_shape() -> None:
    values = np.arange(6, dtype=np.float32)
    request = codec.decode_infer_request(raw_message("FP32", [2, 3], values.tobytes()))
    data = request.inputs["INPUT0"].data
    assert data.shape == (2, 3)
    assert not data.flags.owndata  # np.frombuffer: no copy of the message bytes
    np.testing.assert_array_equal(data.reshape(-1), values)


def test_raw_bytes_input_is_length_prefixed() -> None:
    elements = [b"a", b"", b"\xff\x00z"]
    raw = b"".join(struct.pack("<I", len(e)) + e for e in elements)
    tensor = codec.decode_infer_request(raw_message("BYTES", [3], raw)).inputs["INPUT0"]
    assert tensor.data.dtype == np.object_
    assert tensor.data.tolist() == elements


@pytest.mark.parametrize("raw", [b"\x01\x00", struct.pack("<I", 5) + b"ab",
                                 struct.pack("<I", 1) + b"a"])
def test_raw_bytes_input_malformed(raw: bytes) -> None:
    expect_error(ErrorCode.INVALID_ARG, raw_message("BYTES", [2], raw))


def test_raw_input_size_mismatch() -> None:
    expect_error(ErrorCode.INVALID_ARG, raw_message("FP32", [4], b"\0" * 12), "expected 16")


@pytest.mark.parametrize("datatype", TYPED, ids=lambda t: t.wire)
def test_typed_input_every_datatype(datatype: DataType) -> None:
    values = sample(datatype)
    message = infer_message()
    item = message.inputs.add(name="INPUT0", datatype=datatype.wire, shape=[3])
    getattr(item.contents, codec._TYPED_FIELDS[datatype]).extend(values.tolist())
    tensor = codec.decode_infer_request(message).inputs["INPUT0"]
    assert tensor.data.dtype == datatype.numpy
    np.testing.assert_array_equal(tensor.data, values)


def test_typed_bytes_input() -> None:
    message = infer_message()
    item = message.inputs.add(name="INPUT0", datatype="BYTES", shape=[1, 2])
    item.contents.bytes_contents.extend([b"x", b"yz"])
    tensor = codec.decode_infer_request(message).inputs["INPUT0"]
    assert tensor.shape == (1, 2)
    assert tensor.data.tolist() == [[b"x", b"yz"]]


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_floats_have_no_typed_field(datatype: str) -> None:
    message = infer_message()
    message.inputs.add(name="INPUT0", datatype=datatype, shape=[1])
    expect_error(ErrorCode.INVALID_ARG, message, "raw_input_contents")


def test_typed_input_count_and_range_are_checked() -> None:
    message = infer_message()
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[2]).contents.fp32_contents.append(1)
    expect_error(ErrorCode.INVALID_ARG, message, "expected 2 elements")
    message = infer_message()
    message.inputs.add(name="INPUT0", datatype="INT8", shape=[1]).contents.int_contents.append(300)
    expect_error(ErrorCode.INVALID_ARG, message, "out of range")


def test_mixing_raw_and_typed_is_refused() -> None:
    message = raw_message("FP32", [1], np.float32(1).tobytes())
    message.inputs[0].contents.fp32_contents.append(1.0)
    expect_error(ErrorCode.INVALID_ARG, message, "contents field must not be specified")


def test_raw_contents_count_must_match_inputs() -> None:
    message = raw_message("FP32", [1], np.float32(1).tobytes())
    message.inputs.add(name="INPUT1", datatype="FP32", shape=[1])
    expect_error(ErrorCode.INVALID_ARG, message, "raw_input_contents")


def test_unknown_datatype_negative_shape_and_duplicates() -> None:
    expect_error(ErrorCode.INVALID_ARG, raw_message("FP8", [1], b"\0"), "datatype")
    expect_error(ErrorCode.INVALID_ARG, raw_message("FP32", [-1], b""), "negative")
    message = raw_message("FP32", [0], b"")
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[0])
    message.raw_input_contents.append(b"")
    expect_error(ErrorCode.INVALID_ARG, message, "more than once")


def test_shared_memory_region_must_be_registered() -> None:
    """Without a registry (or with no such region) Triton's GetMemoryInfo text."""
    message = raw_message("FP32", [1], b"")
    del message.raw_input_contents[:]
    message.inputs[0].parameters["shared_memory_region"].string_param = "r"
    expect_error(ErrorCode.NOT_FOUND, message, "Unable to find shared memory region: 'r'")


# ---------------------------------------------------------------- request fields


def test_version_id_and_requested_outputs() -> None:
    message = infer_message(model_version="3", id="abc")
    message.outputs.add(name="OUTPUT0").parameters["x"].int64_param = 1
    request = codec.decode_infer_request(message)
    assert (request.model_name, request.model_version, request.id) == ("m", 3, "abc")
    assert request.requested_output_names() == ["OUTPUT0"]
    assert request.requested_outputs is not None
    assert request.requested_outputs[0].parameters == {"x": 1}
    assert codec.decode_infer_request(infer_message()).model_version is None
    expect_error(ErrorCode.INVALID_ARG, infer_message(model_version="v1"), "version")


def classification_request(count: int) -> InferenceRequest:
    message = infer_message(id="c1")
    message.outputs.add(name="OUTPUT0").parameters["classification"].int64_param = count
    return codec.decode_infer_request(message)


def test_classification_output_is_bytes_in_raw_contents() -> None:
    request = classification_request(2)
    # What the core sets on the responses of a request it admitted.
    served = ServedBy("m", 1, True, {"OUTPUT0": ["cat", "dog", "emu"]})
    scores = np.array([[0.1, 0.7, 0.2], [0.5, 0.25, 0.75]], dtype=np.float32)
    response = InferenceResponse(outputs=[
        Tensor("OUTPUT0", DataType.FP32, (2, 3), scores),
        Tensor("OUTPUT1", DataType.FP32, (2, 3), scores)], served_by=served)
    message = codec.infer_response_message(response, request)
    (output,) = message.outputs
    assert (output.name, output.datatype, list(output.shape)) == ("OUTPUT0", "BYTES", [2, 2])
    assert not output.HasField("contents")
    (raw,) = message.raw_output_contents
    assert split_length_prefixed(raw, 4, "classes") == [
        b"0.700000:1:dog", b"0.200000:2:emu", b"0.750000:2:emu", b"0.500000:0:cat"]


def test_classification_unbatched_without_labels() -> None:
    request = classification_request(5)
    request.model_version = 1
    ints = np.array([3, 9, 1], dtype=np.int32)
    response = InferenceResponse(outputs=[Tensor("OUTPUT0", DataType.INT32, (3,), ints)])
    message = codec.infer_response_message(response, request)
    assert list(message.outputs[0].shape) == [3]
    (raw,) = message.raw_output_contents
    assert split_length_prefixed(raw, 3, "classes") == [b"9:1", b"3:0", b"1:2"]


def test_classification_count_must_be_unsigned() -> None:
    message = infer_message()
    message.outputs.add(name="OUTPUT0").parameters["classification"].int64_param = -1
    expect_error(ErrorCode.INVALID_ARG, message, "classification")
    message = infer_message()
    message.outputs.add(name="OUTPUT0").parameters["classification"].string_param = "2"
    expect_error(ErrorCode.INVALID_ARG, message, "int64_param")


def test_classification_of_bytes_is_refused() -> None:
    request = classification_request(1)
    response = InferenceResponse(outputs=[
        Tensor("OUTPUT0", DataType.BYTES, (1,), np.array([b"x"], dtype=np.object_))])
    with pytest.raises(TritiumError, match="class result not available") as info:
        codec.infer_response_message(response, request)
    assert info.value.code is ErrorCode.INVALID_ARG


def test_request_parameters() -> None:
    message = infer_message()
    params = message.parameters
    params["sequence_id"].int64_param = 7
    params["sequence_start"].bool_param = True
    params["sequence_end"].bool_param = True
    params["priority"].uint64_param = 2
    params["timeout"].int64_param = 1500
    params[codec.EMPTY_FINAL_KEY].bool_param = True
    params["custom_s"].string_param = "v"
    params["custom_b"].bool_param = False
    params["custom_i"].int64_param = -4
    params["custom_d"].double_param = 0.5
    request = codec.decode_infer_request(message)
    assert request.correlation_id == 7
    assert request.flags == SEQUENCE_START | SEQUENCE_END
    assert (request.priority, request.timeout_us) == (2, 1500)
    assert request.parameters == {"custom_s": "v", "custom_b": False, "custom_i": -4,
                                  "custom_d": 0.5}
    assert isinstance(request.frontend_state, codec.GrpcRequestState)
    assert request.frontend_state.empty_final


def test_string_sequence_id() -> None:
    message = infer_message()
    message.parameters["sequence_id"].string_param = "seq-a"
    assert codec.decode_infer_request(message).correlation_id == "seq-a"


@pytest.mark.parametrize("key, setter", [
    ("triton_other", lambda p: setattr(p, "bool_param", True)),
    ("custom", lambda p: setattr(p, "uint64_param", 1)),
    ("custom", lambda p: None),
    ("priority", lambda p: setattr(p, "int64_param", -1)),
    ("timeout", lambda p: setattr(p, "string_param", "1")),
    ("sequence_start", lambda p: setattr(p, "int64_param", 1)),
])
def test_bad_request_parameters(key: str, setter: Any) -> None:
    message = infer_message()
    setter(message.parameters[key])
    expect_error(ErrorCode.INVALID_ARG, message)


# ---------------------------------------------------------------------- outputs


def admitted(requested: list[str] | None = None) -> InferenceRequest:
    message = infer_message(id="r9", model_version="")
    for name in requested or []:
        message.outputs.add(name=name)
    request = codec.decode_infer_request(message)
    request.model_version = 1
    return request


@pytest.mark.parametrize("datatype", NUMERIC, ids=lambda t: t.wire)
def test_raw_output_every_numeric_datatype(datatype: DataType) -> None:
    values = sample(datatype).reshape(1, 3)
    response = InferenceResponse(outputs=[Tensor("OUTPUT0", datatype, (1, 3), values)],
                                 served_by=ServedBy("m", 1, False, {}))
    message = codec.infer_response_message(response, admitted())
    assert (message.model_name, message.model_version, message.id) == ("m", "1", "r9")
    assert len(message.outputs) == 1 and not message.outputs[0].HasField("contents")
    out = message.outputs[0]
    assert (out.name, out.datatype, list(out.shape)) == ("OUTPUT0", datatype.wire, [1, 3])
    assert message.raw_output_contents[0] == values.tobytes()


def test_output_cast_to_declared_dtype() -> None:
    data = np.array([1.5, 2.5], dtype=np.float64)
    response = InferenceResponse(outputs=[Tensor("OUTPUT0", DataType.FP32, (2,), data)])
    raw = codec.infer_response_message(response, admitted()).raw_output_contents[0]
    np.testing.assert_array_equal(np.frombuffer(raw, dtype=np.float32), data)


def test_bytes_output_is_length_prefixed() -> None:
    data = np.array([b"ab", "c", b""], dtype=object)
    response = InferenceResponse(outputs=[Tensor("OUTPUT0", DataType.BYTES, (3,), data)])
    raw = codec.infer_response_message(response, admitted()).raw_output_contents[0]
    assert raw == b"\x02\0\0\0ab\x01\0\0\0c\0\0\0\0"
    assert split_length_prefixed(raw, 3, "x") == [b"ab", b"c", b""]


def test_only_requested_outputs_are_sent() -> None:
    one = np.zeros(1, dtype=np.float32)
    response = InferenceResponse(outputs=[Tensor("OUTPUT0", DataType.FP32, (1,), one),
                                          Tensor("OUTPUT1", DataType.FP32, (1,), one)])
    message = codec.infer_response_message(response, admitted(["OUTPUT1"]))
    assert [o.name for o in message.outputs] == ["OUTPUT1"]
    assert len(message.raw_output_contents) == 1


def test_output_element_count_mismatch_is_internal() -> None:
    data = np.zeros(2, dtype=np.float32)
    response = InferenceResponse(outputs=[Tensor("OUTPUT0", DataType.FP32, (3,), data)])
    with pytest.raises(TritiumError) as info:
        codec.infer_response_message(response, admitted())
    assert info.value.code is ErrorCode.INTERNAL


def test_response_parameters() -> None:
    response = InferenceResponse(parameters={"b": True, "i": -3, "u": 1 << 63, "d": 0.25,
                                             "s": "x"})
    params = codec.infer_response_message(response, admitted()).parameters
    assert params["b"].bool_param is True
    assert params["i"].int64_param == -3
    assert params["u"].uint64_param == 1 << 63
    assert params["d"].double_param == 0.25
    assert params["s"].string_param == "x"


# ----------------------------------------------------------------------- stream


def test_stream_response_carries_final_flag() -> None:
    data = np.ones(1, dtype=np.float32)
    for final in (False, True):
        response = InferenceResponse(outputs=[Tensor("OUTPUT0", DataType.FP32, (1,), data)],
                                     final=final)
        message = codec.encode_stream_response(response, admitted())
        assert message is not None and not message.error_message
        assert message.infer_response.parameters[codec.FINAL_KEY].bool_param is final
        assert message.infer_response.raw_output_contents[0] == data.tobytes()


def test_flag_only_final_is_written_only_when_asked() -> None:
    request = admitted()
    assert codec.encode_stream_response(InferenceResponse.final_flag(), request) is None
    message = infer_message(id="e1", model_version="")
    message.parameters[codec.EMPTY_FINAL_KEY].bool_param = True
    request = codec.decode_infer_request(message)
    request.model_version = 1
    out = codec.encode_stream_response(InferenceResponse.final_flag(), request)
    assert out is not None
    infer = out.infer_response
    assert (infer.id, infer.model_name, infer.model_version) == ("e1", "m", "")
    assert not infer.outputs and not out.error_message
    assert infer.parameters[codec.FINAL_KEY].bool_param is True


def test_stream_error_from_model() -> None:
    error = TritiumError(ErrorCode.INVALID_ARG, "model refused")
    message = codec.encode_stream_response(InferenceResponse.failure(error), admitted())
    assert message is not None
    assert message.error_message == "model refused"
    assert (message.infer_response.id, message.infer_response.model_name) == ("r9", "m")
    assert message.infer_response.parameters[codec.FINAL_KEY].bool_param is True
    assert not message.infer_response.outputs


def test_stream_error_before_admission() -> None:
    message = codec.encode_stream_error(TritiumError(ErrorCode.NOT_FOUND, "no model"), "q")
    assert message.error_message == "no model"
    assert message.infer_response == pb.ModelInferResponse(id="q")


# ---------------------------------------------------------- metadata and status


def test_metadata_and_index() -> None:
    meta = ModelMetadata("m", ["1", "2"], "python", [TensorMetadata("I", "FP32", [-1, 4])], [])
    message = codec.encode_model_metadata(meta)
    assert (message.name, list(message.versions), message.platform) == ("m", ["1", "2"], "python")
    assert list(message.inputs[0].shape) == [-1, 4] and not message.outputs
    index = codec.encode_repository_index([
        IndexEntry("a", 1, ModelState.READY), IndexEntry("b", None, ModelState.UNAVAILABLE, "x")])
    assert [(m.name, m.version, m.state, m.reason) for m in index.models] == [
        ("a", "1", "READY", ""), ("b", "", "UNAVAILABLE", "x")]
    server = codec.encode_server_metadata({"name": "triton", "version": "2", "extensions": ["e"]})
    assert list(server.extensions) == ["e"]


def test_repository_and_log_settings_parameters() -> None:
    load = pb.RepositoryModelLoadRequest(model_name="m")
    load.parameters["config"].string_param = "{}"
    load.parameters["file:1/model.py"].bytes_param = b"code"
    assert codec.decode_repository_parameters(load.parameters) == {
        "config": "{}", "file:1/model.py": b"code"}
    request = pb.LogSettingsRequest()
    request.settings["log_verbose_level"].uint32_param = 2
    assert codec.decode_log_settings(request) == {"log_verbose_level": 2}
    request.settings["log_info"].string_param = "yes"
    with pytest.raises(TritiumError):
        codec.decode_log_settings(request)
    encoded = codec.encode_log_settings({"log_info": True, "log_file": ""})
    assert encoded.settings["log_info"].bool_param is True


def test_every_error_code_has_a_grpc_status() -> None:
    import grpc

    # Our codes carry the numbers grpcio's clients decode.
    assert grpc_status(ErrorCode.INVALID_ARG) == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert grpc_status(ErrorCode.UNSUPPORTED) == grpc.StatusCode.UNIMPLEMENTED.value[0]
    for code in ErrorCode:
        name = {"INVALID_ARG": "INVALID_ARGUMENT",
                "UNSUPPORTED": "UNIMPLEMENTED"}.get(code.name, code.name)
        assert grpc_status(code).name == name
        assert int(grpc_status(code)) == grpc.StatusCode[name].value[0]


@pytest.mark.parametrize("size", [0, 1, 127, 128, 300, 70000, 1 << 21])
def test_serialized_response_pieces_are_the_message_bytes(size: int) -> None:
    big = np.arange(size, dtype=np.float32)
    words = np.array([b"ab", "c", b""], dtype=object)
    response = InferenceResponse(
        outputs=[Tensor("OUTPUT0", DataType.FP32, (size,), big),
                 Tensor("OUTPUT1", DataType.BYTES, (3,), words),
                 Tensor("OUTPUT2", DataType.FP64, (2,), np.array([1.0, 2.0]))],
        parameters={"i": 7, "s": "x"})
    pieces = codec.encode_infer_response(response, admitted())
    expected = codec.infer_response_message(response, admitted())
    wire = b"".join(pieces)
    assert wire == expected.SerializeToString()
    assert pb.ModelInferResponse.FromString(wire) == expected
    # The numeric tensor travels as a view of the model's array, not as a copy.
    views = [piece for piece in pieces if isinstance(piece, memoryview)]
    assert [len(view) for view in views] == [4 * size, 16]


def test_serialized_classification_matches_the_message() -> None:
    request = classification_request(2)
    served = ServedBy("m", 1, True, {"OUTPUT0": ["cat", "dog", "emu"]})
    scores = np.array([[0.1, 0.7, 0.2], [0.5, 0.25, 0.75]], dtype=np.float32)
    response = InferenceResponse(outputs=[Tensor("OUTPUT0", DataType.FP32, (2, 3), scores)],
                                 served_by=served)
    wire = b"".join(codec.encode_infer_response(response, request))
    assert wire == codec.infer_response_message(response, request).SerializeToString()


# ------------------------------------------------------------- checks before decoding


@dataclasses.dataclass
class Model:
    """What the codec's checks read of a ModelHandle."""

    name: str = "m"
    max_batch_size: int = 0
    inputs: dict[str, TensorSpec] = dataclasses.field(default_factory=lambda: {
        "INPUT0": TensorSpec("INPUT0", DataType.FP32, (-1,))})


def handle(model: Model) -> ModelHandle:
    return cast(ModelHandle, model)


def test_inputs_are_checked_against_the_model_before_any_data_is_decoded() -> None:
    # Malformed BYTES data: the datatype error comes first, so it was never split.
    message = raw_message("BYTES", [3], b"\x01\x00")
    with pytest.raises(TritiumError, match="data-type is 'BYTES', but model 'm' expects"):
        codec.decode_infer_request(message, handle(Model()))
    message = raw_message("FP32", [2], b"\x00" * 8)
    message.inputs[0].name = "OTHER"
    with pytest.raises(TritiumError, match="unexpected inference input 'OTHER'"):
        codec.decode_infer_request(message, handle(Model()))


def test_a_request_checked_against_a_model_says_for_which() -> None:
    """The core trusts the per-input checks for that handle only (validation.py)."""
    model = handle(Model())
    message = raw_message("FP32", [2], b"\x00" * 8)
    assert codec.decode_infer_request(message, model).checked_for is model
    assert codec.decode_infer_request(message).checked_for is None


@pytest.mark.parametrize("shape, text", [
    ([1] * 65, "has 65 dimensions, more than the 64 allowed"),
    ([2**31, 2**31, 2**31], "more elements than a tensor can"),
])
def test_absurd_shapes_are_invalid(shape: list[int], text: str) -> None:
    expect_error(ErrorCode.INVALID_ARG, raw_message("FP32", shape, b""), text)
    message = infer_message()
    message.inputs.add(name="INPUT0", datatype="FP32", shape=shape)
    expect_error(ErrorCode.INVALID_ARG, message, text)


def test_long_typed_contents_are_converted_in_slices() -> None:
    values = np.arange(200_001, dtype=np.int32) % 60_000 - 30_000
    message = infer_message()
    item = message.inputs.add(name="INPUT0", datatype="INT16", shape=[values.size])
    item.contents.int_contents.extend(values.tolist())
    tensor = codec.decode_infer_request(message).inputs["INPUT0"]
    assert tensor.data.dtype == np.int16 and tensor.data.tolist() == values.tolist()
    item.contents.int_contents[150_000] = 1 << 20
    expect_error(ErrorCode.INVALID_ARG, message, "out of range for INT16")


def small(message: pb.ModelInferRequest, limit: int) -> InferenceRequest | None:
    return codec.decode_small_request(message, None, None, limit)


def test_a_small_decode_gives_way_to_what_the_inputs_claim() -> None:
    fp32 = raw_message("FP32", [4, 2], bytes(32))
    assert small(fp32, 32) is not None and small(fp32, 31) is None
    assert small(raw_message("BYTES", [5], b""), 19) is None  # 4 a BYTES element
    assert small(raw_message("FP32", [2**40], b""), 2**20) is None  # before the size check
    typed = infer_message()
    typed.inputs.add(name="INPUT0", datatype="FP32", shape=[3]).contents.fp32_contents.extend(
        [1.0, 2.0, 3.0])
    assert small(typed, 12 + 24) is not None and small(typed, 12 + 23) is None
    # What the inputs before the claim raise is raised, as the full decode would.
    bad = raw_message("FP32", [-1], b"")
    bad.inputs.add(name="INPUT1", datatype="FP32", shape=[2**40])
    bad.raw_input_contents.append(b"")
    with pytest.raises(TritiumError, match="negative dimension"):
        small(bad, 2**20)


def test_bytes_past_the_claimed_count_are_not_walked() -> None:
    message = raw_message("BYTES", [1], bytes(4 * 100_000))
    expect_error(ErrorCode.INVALID_ARG, message, "expected 1 string elements for input "
                 "'INPUT0', got at least")


def test_lifted_raw_inputs_decode_to_tensors_over_the_wire_bytes() -> None:
    """A big raw input parsed as a view (see parse.py) becomes a read-only tensor viewing
    the received bytes: neither the parse nor the decode copies it."""
    values = np.arange(1 << 20, dtype=np.float32)
    message = pb.ModelInferRequest(model_name="m")
    message.inputs.add(name="BIG", datatype="FP32", shape=[values.size])
    message.inputs.add(name="SMALL", datatype="BYTES", shape=[1])
    message.raw_input_contents.extend([values.tobytes(), b"\x02\x00\x00\x00hi"])
    wire = message.SerializeToString()
    lifted = asyncio.run(parse_message(pb.ModelInferRequest, wire))
    request = codec.decode_infer_request(lifted)
    big = request.inputs["BIG"].data
    assert np.array_equal(big, values) and not big.flags.writeable
    assert np.shares_memory(big, np.frombuffer(wire, np.uint8))
    assert request.inputs["SMALL"].data.tolist() == [b"hi"]
