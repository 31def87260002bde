"""HTTP infer codec: request bytes from tritonclient in, response bytes it can read out."""

from __future__ import annotations

import dataclasses
import gzip
import zlib
from typing import Any, cast

import ml_dtypes
import msgspec
import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
from tritonclient.http._utils import _get_inference_request

from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.model import ModelHandle
from tritium.core.request import SEQUENCE_END, SEQUENCE_START, InferenceRequest
from tritium.core.response import InferenceResponse, ServedBy
from tritium.core.types import DataType, Tensor, TensorSpec
from tritium.frontends.http.codec import (
    BINARY_CONTENT_TYPE,
    HEADER_LENGTH,
    JSON_CONTENT_TYPE,
    HttpOutputOptions,
    decode_infer_request,
    decode_raw_binary_request,
    encode_error,
    encode_infer_response,
)
from tritium.frontends.http.compression import choose_encoding, compress_response, decompress_body

SAMPLES: dict[str, np.ndarray] = {
    "BOOL": np.array([[True, False, True], [False, False, True]]),
    "UINT8": np.array([[0, 7, 255], [1, 2, 3]], dtype=np.uint8),
    "UINT16": np.array([[0, 7, 65535], [1, 2, 3]], dtype=np.uint16),
    "UINT32": np.array([[0, 7, 2**32 - 1], [1, 2, 3]], dtype=np.uint32),
    "UINT64": np.array([[0, 7, 2**64 - 1], [1, 2, 3]], dtype=np.uint64),
    "INT8": np.array([[-128, 0, 127], [1, -2, 3]], dtype=np.int8),
    "INT16": np.array([[-32768, 0, 32767], [1, -2, 3]], dtype=np.int16),
    "INT32": np.array([[-(2**31), 0, 2**31 - 1], [1, -2, 3]], dtype=np.int32),
    "INT64": np.array([[-(2**63), 0, 2**63 - 1], [1, -2, 3]], dtype=np.int64),
    "FP16": np.array([[0.5, -1.25, 3.0], [1, 2, 3]], dtype=np.float16),
    "FP32": np.array([[0.1, -1.5, 3.25e10], [1, 2, 3]], dtype=np.float32),
    "FP64": np.array([[0.1, -1.5, 1e300], [1, 2, 3]], dtype=np.float64),
    "BYTES": np.array([[b"a", b"", b"hello"], ["é".encode(), b"x" * 300, b"z"]], dtype=object),
    "BF16": np.array([[0.5, -1.25, 3.0], [1, 2, 3]], dtype=ml_dtypes.bfloat16),
}
JSON_TYPES = [t for t in SAMPLES if t not in ("FP16", "BF16")]


def client_body(
    inputs: list[httpclient.InferInput],
    outputs: list[httpclient.InferRequestedOutput] | None = None,
    request_id: str = "",
    parameters: dict[str, Any] | None = None,
    **kwargs: Any,
) -> tuple[bytes, int | None]:
    """Request bytes exactly as tritonclient.http would put them on the wire."""
    options: dict[str, Any] = {"sequence_id": 0, "sequence_start": False, "sequence_end": False}
    options.update(priority=0, timeout=None)
    options.update(kwargs)
    return _get_inference_request(
        inputs, request_id, outputs, options["sequence_id"], options["sequence_start"],
        options["sequence_end"], options["priority"], options["timeout"], parameters,
    )


def client_input(
    name: str, datatype: str, array: np.ndarray, binary: bool
) -> httpclient.InferInput:
    tensor = httpclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def decode_json(doc: dict[str, Any], binary: bytes = b"") -> InferenceRequest:
    header = orjson.dumps(doc)
    return decode_infer_request(header + binary, len(header) if binary else None, "m", None)


def read_result(headers: list[tuple[str, str]], parts: list[Any]) -> httpclient.InferResult:
    length = dict(headers).get(HEADER_LENGTH)
    body = b"".join(bytes(part) for part in parts)
    return httpclient.InferResult.from_response_body(
        body, header_length=int(length) if length is not None else None
    )


def encode(response: InferenceResponse, request: InferenceRequest, name: str = "m",
           version: int = 1) -> tuple[list[tuple[str, str]], list[Any]]:
    """Encode as for a response the core delivered from version ``version`` of ``name``."""
    if response.served_by is None:
        response = msgspec.structs.replace(response, served_by=ServedBy(name, version, False, {}))
    return encode_infer_response(response, request)


def echo(request: InferenceRequest, **kwargs: Any) -> tuple[list[tuple[str, str]], list[Any]]:
    response = InferenceResponse(outputs=list(request.inputs.values()))
    return encode(response, request, "m", 3, **kwargs)


def expect_invalid(match: str, call: Any, *args: Any) -> TritiumError:
    with pytest.raises(TritiumError, match=match) as info:
        call(*args)
    assert info.value.code is ErrorCode.INVALID_ARG
    return info.value


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("datatype", list(SAMPLES))
def test_binary_round_trip_through_tritonclient(datatype: str) -> None:
    array = SAMPLES[datatype]
    body, length = client_body([client_input("X", datatype, array, binary=True)])
    request = decode_infer_request(body, length, "m", None)
    tensor = request.inputs["X"]
    assert tensor.datatype is DataType.from_wire(datatype)
    assert tensor.shape == (2, 3)
    if datatype == "BF16":
        assert np.array_equal(tensor.data, array.view(np.uint16))
    else:
        assert np.array_equal(tensor.data, array)
    headers, parts = echo(request)
    assert dict(headers)["Content-Type"] == BINARY_CONTENT_TYPE
    result = read_result(headers, parts)
    got = result.as_numpy("X")
    assert got.shape == (2, 3)
    if datatype == "BF16":
        assert np.array_equal(got.view(np.uint16), array.view(np.uint16))
    else:
        assert np.array_equal(got, array)


@pytest.mark.parametrize("datatype", JSON_TYPES)
def test_json_round_trip_through_tritonclient(datatype: str) -> None:
    array = SAMPLES[datatype]
    if datatype == "BYTES":
        array = np.array([[b"a", b"", b"hello"], ["é".encode(), b"q", b"z"]], dtype=object)
    body, length = client_body(
        [client_input("X", datatype, array, binary=False)],
        [httpclient.InferRequestedOutput("X", binary_data=False)],
    )
    assert length is None
    request = decode_infer_request(body, length, "m", None)
    assert np.array_equal(request.inputs["X"].data, array)
    assert request.inputs["X"].data.dtype == request.inputs["X"].datatype.numpy
    headers, parts = echo(request)
    assert headers == [("Content-Type", JSON_CONTENT_TYPE)]
    assert len(parts) == 1
    got = read_result(headers, parts).as_numpy("X")
    if datatype == "BYTES":
        assert got.tolist() == [[s.decode() for s in row] for row in array.tolist()]
    else:
        assert np.array_equal(got, array)


def test_binary_input_is_a_view_of_the_body() -> None:
    body, length = client_body([client_input("X", "FP32", SAMPLES["FP32"], binary=True)])
    buffer = bytearray(body)
    tensor = decode_infer_request(buffer, length, "m", None).inputs["X"]
    buffer[-4:] = np.float32(42).tobytes()
    assert tensor.data[1, 2] == 42


def test_json_data_nested_and_flat_agree() -> None:
    flat = decode_json({"inputs": [{"name": "X", "shape": [2, 2], "datatype": "INT32",
                                    "data": [1, 2, 3, 4]}]})
    nested = decode_json({"inputs": [{"name": "X", "shape": [2, 2], "datatype": "INT32",
                                      "data": [[1, 2], [3, 4]]}]})
    assert flat.inputs["X"].data.tolist() == [[1, 2], [3, 4]]
    assert nested.inputs["X"].data.tolist() == [[1, 2], [3, 4]]


def test_json_bytes_become_utf8_bytes_objects() -> None:
    request = decode_json({"inputs": [{"name": "S", "shape": [2], "datatype": "BYTES",
                                       "data": ["hé", ""]}]})
    data = request.inputs["S"].data
    assert data.dtype == object
    assert data.tolist() == ["hé".encode(), b""]


def test_zero_size_inputs() -> None:
    header = {"inputs": [
        {"name": "A", "shape": [0], "datatype": "FP32", "parameters": {"binary_data_size": 0}},
        {"name": "B", "shape": [0, 3], "datatype": "INT8", "data": []},
    ]}
    request = decode_json(header)
    assert request.inputs["A"].data.shape == (0,)
    assert request.inputs["B"].data.shape == (0, 3)


# ---------------------------------------------------------------- request fields


def test_request_parameters_map_to_request_fields() -> None:
    body, length = client_body(
        [client_input("X", "INT32", np.array([1], dtype=np.int32), binary=False)],
        request_id="abc", sequence_id=42, sequence_start=True, sequence_end=True,
        priority=2, timeout=1500, parameters={"temperature": 0.5, "mode": "x", "n": 3,
                                              "flag": False},
    )
    request = decode_infer_request(body, length, "model", 4)
    assert (request.model_name, request.model_version, request.id) == ("model", 4, "abc")
    assert request.correlation_id == 42
    assert request.flags == SEQUENCE_START | SEQUENCE_END
    assert (request.priority, request.timeout_us) == (2, 1500)
    assert request.parameters == {"temperature": 0.5, "mode": "x", "n": 3, "flag": False}
    # tritonclient asks for binary outputs when it lists none.
    assert request.frontend_state == HttpOutputOptions(binary_data_output=True)
    assert request.requested_outputs is None


def test_string_sequence_id_and_start_only() -> None:
    request = decode_json({"parameters": {"sequence_id": "s-1", "sequence_start": True,
                                          "sequence_end": False}, "inputs": []})
    assert request.correlation_id == "s-1"
    assert request.flags == SEQUENCE_START


@pytest.mark.parametrize("key", ["triton_enable_empty_final_response", "triton_x", "headers"])
def test_reserved_parameters_are_refused(key: str) -> None:
    expect_invalid("reserved", decode_json, {"parameters": {key: 1}, "inputs": []})


@pytest.mark.parametrize(
    "params, match",
    [
        ({"custom": [1]}, "invalid type"),
        ({"custom": {"a": 1}}, "invalid type"),
        ({"custom": None}, "invalid type"),
        ({"sequence_id": -1}, "sequence_id"),
        ({"sequence_id": True}, "sequence_id"),
        ({"sequence_start": 1}, "sequence_start"),
        ({"priority": "high"}, "priority"),
        ({"timeout": 1.5}, "timeout"),
        ({"binary_data_output": "yes"}, "binary_data_output"),
    ],
)
def test_bad_request_parameters(params: dict[str, Any], match: str) -> None:
    expect_invalid(match, decode_json, {"parameters": params, "inputs": []})


def test_requested_outputs_keep_their_parameters() -> None:
    body, length = client_body(
        [client_input("X", "INT32", np.array([1], dtype=np.int32), binary=False)],
        [httpclient.InferRequestedOutput("A"), httpclient.InferRequestedOutput("B", False, 2)],
    )
    request = decode_infer_request(body, length, "m", None)
    assert request.requested_outputs is not None
    assert [(o.name, o.parameters) for o in request.requested_outputs] == [
        ("A", {"binary_data": True}),
        ("B", {"classification": 2, "binary_data": False}),
    ]
    assert request.frontend_state == HttpOutputOptions(binary_data_output=False)


# ---------------------------------------------------------------- malformed requests


def test_malformed_json() -> None:
    expect_invalid("failed to parse the request JSON", decode_infer_request, b"{", None, "m", None)
    expect_invalid("failed to parse the request JSON", decode_infer_request, b"", None, "m", None)
    expect_invalid("not an object", decode_infer_request, b"[1]", None, "m", None)


INPUT = {"name": "X", "shape": [2], "datatype": "INT32", "data": [1, 2]}


@pytest.mark.parametrize(
    "doc, match",
    [
        ({}, "Unable to parse 'inputs'"),
        ({"inputs": {"name": "X"}}, "Unable to parse 'inputs'"),
        ({"inputs": [1]}, "no field is set"),
        ({"id": 5, "inputs": []}, "Unable to parse 'id'"),
        ({"parameters": [], "inputs": []}, "params"),
        ({"inputs": [{**INPUT, "name": 3}]}, "Unable to parse 'name'"),
        ({"inputs": [{**INPUT, "datatype": "FLOAT"}]}, "invalid datatype"),
        ({"inputs": [{**INPUT, "shape": [-1]}]}, "Unable to parse 'shape'"),
        ({"inputs": [{**INPUT, "shape": "2"}]}, "Unable to parse 'shape'"),
        ({"inputs": [{**INPUT, "shape": [2.0]}]}, "Unable to parse 'shape'"),
        ({"inputs": [{**INPUT, "parameters": 1}]}, "Unable to parse 'parameters'"),
        ({"inputs": [INPUT, INPUT]}, "already exists"),
        ({"inputs": [{k: v for k, v in INPUT.items() if k != "data"}]}, "no field is set"),
        ({"inputs": [{**INPUT, "parameters": {"binary_data_size": 8}}]},
         "But set 'data' 'binary_data_size'"),
        ({"inputs": [{**INPUT, "parameters": {"shared_memory_region": "r"}}]}, "only one"),
        ({"inputs": [{"name": "X", "shape": [1], "datatype": "INT32",
                      "parameters": {"binary_data_size": -4}}]}, "binary_data_size"),
        ({"inputs": [], "outputs": {"name": "Y"}}, "Unable to parse 'outputs'"),
        ({"inputs": [], "outputs": [{"parameters": {}}]}, "Unable to parse 'name'"),
        ({"inputs": [], "outputs": [{"name": "Y", "parameters": {"binary_data": 1}}]},
         "binary_data"),
        ({"inputs": [], "outputs": [{"name": "Y", "parameters": {"classification": -1}}]},
         "classification"),
    ],
)
def test_wrong_json_shapes(doc: dict[str, Any], match: str) -> None:
    expect_invalid(match, decode_json, doc)


@pytest.mark.parametrize(
    "datatype, data, match",
    [
        ("BOOL", [1, 0], "Unable to parse 'data': attempt to access JSON non-boolean as "
                         "boolean"),
        ("INT32", [1.0, 2], "non-signed-integer as signed-integer"),
        ("INT32", [True, 2], "non-signed-integer as signed-integer"),
        ("UINT16", ["1", 2], "non-unsigned-integer as unsigned-integer"),
        ("UINT8", [-1, 2], "out of range"),
        ("INT8", [128, 2], "out of range"),
        ("UINT32", [2**32, 1], "out of range"),
        ("INT64", [2**63, 1], "out of range"),
        ("FP32", ["1", 2], "attempt to access JSON non-number as double"),
        ("BYTES", [b"x".hex(), 2], "attempt to access JSON non-string as string"),
        ("FP16", [1.0, 2.0], "FP16 data via JSON is not supported"),
        ("BF16", [1.0, 2.0], "BF16 data via JSON is not supported"),
        ("INT32", [1, 2, 3], "Shape does not match"),
        ("INT32", [1], "Shape does not match"),
        ("INT32", [[1, 2], [3]], "Shape does not match"),
        ("INT32", [1, [2]], "non-signed-integer as signed-integer"),
        ("INT32", 7, "Unable to parse 'data'"),
    ],
)
def test_bad_json_data(datatype: str, data: Any, match: str) -> None:
    doc = {"inputs": [{"name": "X", "shape": [2], "datatype": datatype, "data": data}]}
    expect_invalid(match, decode_json, doc)


def test_integers_beyond_64_bits_arrive_as_floats_and_are_refused() -> None:
    body = (b'{"inputs":[{"name":"X","shape":[1],"datatype":"UINT64",'
            b'"data":[18446744073709551616]}]}')
    expect_invalid("non-unsigned-integer as unsigned-integer", decode_infer_request, body,
                   None, "m", None)


def test_json_nesting_depth_is_capped() -> None:
    data: list[Any] = [1]
    for _ in range(150):
        data = [data]
    doc = {"inputs": [{"name": "X", "shape": [1], "datatype": "INT32", "data": data}]}
    expect_invalid("nesting depth", decode_json, doc)


def binary_input(name: str, size: int, datatype: str = "FP32", shape: int = 2) -> dict[str, Any]:
    return {"name": name, "shape": [shape], "datatype": datatype,
            "parameters": {"binary_data_size": size}}


def test_binary_size_mismatches() -> None:
    one = {"inputs": [binary_input("X", 8)]}
    expect_invalid("expecting 4 additional bytes", decode_json, one, b"\0" * 4)
    expect_invalid("unexpected additional input data", decode_json, one, b"\0" * 12)
    wrong = {"inputs": [binary_input("X", 4)]}
    expect_invalid("input byte size mismatch for input 'X'.*Expected 8, got 4",
                   decode_json, wrong, b"\0" * 4)


def test_binary_inputs_are_read_in_json_order() -> None:
    doc = {"inputs": [binary_input("A", 8, "INT32"), binary_input("B", 2, "UINT8")]}
    blob = np.array([5, 6], dtype=np.int32).tobytes() + bytes([7, 8])
    request = decode_json(doc, blob)
    assert request.inputs["A"].data.tolist() == [5, 6]
    assert request.inputs["B"].data.tolist() == [7, 8]


def test_binary_needs_the_header_length() -> None:
    header = orjson.dumps({"inputs": [binary_input("X", 8)]})
    expect_invalid(HEADER_LENGTH, decode_infer_request, header, None, "m", None)
    # Without the header the whole body is JSON, so trailing binary is a parse error.
    expect_invalid("failed to parse", decode_infer_request, header + b"\0" * 8, None, "m", None)


@pytest.mark.parametrize("length", [-1, 10_000])
def test_header_length_out_of_range(length: int) -> None:
    expect_invalid("inference header size should be in range",
                   decode_infer_request, b'{"inputs":[]}', length, "m", None)


def test_json_header_size_limit() -> None:
    body = orjson.dumps({"inputs": [INPUT]})
    with pytest.raises(TritiumError, match="--http-max-input-size"):
        decode_infer_request(body, None, "m", None, max_input_size=10)


@pytest.mark.parametrize(
    "blob, match",
    [
        (b"\x01\x00\x00\x00a\x01\x00", "incomplete string length indicator"),
        (b"\x05\x00\x00\x00ab", "incomplete string data"),
        (b"\x01\x00\x00\x00a", "expected 2 string elements for inference input 'S'.*got 1"),
        (b"\x00\x00\x00\x00" * 3, "expected 2 string elements.*got 3"),
    ],
)
def test_bytes_length_prefixes_are_checked(blob: bytes, match: str) -> None:
    doc = {"id": "r9", "inputs": [binary_input("S", len(blob), "BYTES")]}
    error = expect_invalid(match, decode_json, doc, blob)
    assert error.message.startswith("[request id: r9] ")


def test_bytes_length_prefixes_are_little_endian() -> None:
    blob = b"\x02\x00\x00\x00hi" + b"\x00\x01\x00\x00" + b"y" * 256
    request = decode_json({"inputs": [binary_input("S", len(blob), "BYTES")]}, blob)
    assert request.inputs["S"].data.tolist() == [b"hi", b"y" * 256]


# ---------------------------------------------------------------- raw binary


def test_raw_binary_request_fills_the_variable_dim() -> None:
    spec = TensorSpec("RAW", DataType.FP32, (-1, 2))
    body = np.arange(6, dtype=np.float32).tobytes()
    request = decode_raw_binary_request(body, spec, True, "m", None)
    assert request.inputs["RAW"].shape == (1, 3, 2)
    assert request.inputs["RAW"].data.tolist() == [[[0, 1], [2, 3], [4, 5]]]
    assert request.frontend_state == HttpOutputOptions(binary_data_output=True)


def test_raw_binary_bytes_and_errors() -> None:
    spec = TensorSpec("RAW", DataType.BYTES, (1,))
    request = decode_raw_binary_request(b"\xffdata", spec, False, "m", None)
    assert request.inputs["RAW"].data.tolist() == [b"\xffdata"]
    expect_invalid("must have input shape \\[1\\]", decode_raw_binary_request, b"x",
                   TensorSpec("RAW", DataType.BYTES, (-1,)), False, "m", None)
    expect_invalid("more than one variable-sized", decode_raw_binary_request, b"",
                   TensorSpec("RAW", DataType.FP32, (-1, -1)), False, "m", None)
    expect_invalid("byte size mismatch", decode_raw_binary_request, b"\0" * 6,
                   TensorSpec("RAW", DataType.FP32, (2,)), False, "m", None)
    expect_invalid("header size 0", decode_infer_request, b"\0" * 4, 0, "m", None)


# ---------------------------------------------------------------- responses


def tensor(name: str, array: np.ndarray, datatype: str | None = None) -> Tensor:
    dtype = DataType.from_wire(datatype) if datatype else DataType.from_numpy(array.dtype)
    assert dtype is not None
    return Tensor(name, dtype, tuple(array.shape), array)


def outputs_request(doc: dict[str, Any]) -> InferenceRequest:
    return decode_json({"inputs": [], **doc})


RESPONSE = InferenceResponse(outputs=[
    tensor("D", np.array([1, 2], dtype=np.int32)),
    tensor("A", np.array([1.5, 2.5], dtype=np.float32)),
    tensor("B", np.array([True, False])),
    tensor("C", np.array([b"x", b"yz"], dtype=object), "BYTES"),
])


def header_json(parts: list[Any]) -> dict[str, Any]:
    return orjson.loads(parts[0])


def test_listed_outputs_binary_only_with_their_own_flag() -> None:
    request = outputs_request({
        "parameters": {"binary_data_output": True},
        "outputs": [{"name": "C"}, {"name": "A", "parameters": {"binary_data": True}},
                    {"name": "B", "parameters": {"binary_data": False}}],
    })
    headers, parts = encode(RESPONSE, request, "m", 1)
    outputs = header_json(parts)["outputs"]
    # Produced order, only the listed ones.
    assert [o["name"] for o in outputs] == ["A", "B", "C"]
    assert outputs[0]["parameters"] == {"binary_data_size": 8} and "data" not in outputs[0]
    assert outputs[1]["data"] == [True, False]
    assert outputs[2]["data"] == ["x", "yz"]
    assert dict(headers) == {"Content-Type": BINARY_CONTENT_TYPE,
                             HEADER_LENGTH: str(len(parts[0]))}
    assert b"".join(bytes(p) for p in parts[1:]) == np.array([1.5, 2.5], np.float32).tobytes()
    result = read_result(headers, parts)
    assert result.as_numpy("A").tolist() == [1.5, 2.5]
    assert result.as_numpy("C").tolist() == ["x", "yz"]  # JSON BYTES come back as str


@pytest.mark.parametrize("binary", [True, False])
def test_unlisted_outputs_follow_binary_data_output(binary: bool) -> None:
    request = outputs_request({"parameters": {"binary_data_output": binary}})
    headers, parts = encode(RESPONSE, request, "m", 1)
    outputs = header_json(parts)["outputs"]
    assert [o["name"] for o in outputs] == ["D", "A", "B", "C"]
    assert all(("data" in o) is not binary for o in outputs)
    assert (HEADER_LENGTH in dict(headers)) is binary
    assert len(parts) == (5 if binary else 1)
    result = read_result(headers, parts)
    assert result.as_numpy("D").tolist() == [1, 2]
    assert result.as_numpy("B").tolist() == [True, False]


def test_binary_outputs_without_bytes_send_plain_json() -> None:
    request = outputs_request({"parameters": {"binary_data_output": True}})
    response = InferenceResponse(outputs=[tensor("E", np.zeros((0, 4), dtype=np.float32))])
    headers, parts = encode(response, request, "m", 1)
    assert headers == [("Content-Type", JSON_CONTENT_TYPE)]
    assert header_json(parts)["outputs"][0]["parameters"] == {"binary_data_size": 0}
    assert read_result(headers, parts).as_numpy("E").shape == (0, 4)


def test_response_header_fields() -> None:
    request = outputs_request({"id": "req-7"})
    response = InferenceResponse(outputs=[], parameters={"p": 1, "q": "s", "r": True})
    _, parts = encode(response, request, "model", 12)
    assert parts[0] == (b'{"id":"req-7","model_name":"model","model_version":"12",'
                        b'"parameters":{"p":1,"q":"s","r":true},"outputs":[]}')
    _, parts = encode(InferenceResponse(), outputs_request({}), "m", 1)
    assert "id" not in header_json(parts) and "parameters" not in header_json(parts)


def test_requests_from_other_frontends_get_json_outputs() -> None:
    request = InferenceRequest(model_name="m", inputs={})
    _, parts = encode(RESPONSE, request, "m", 1)
    assert header_json(parts)["outputs"][0]["data"] == [1, 2]


def test_bytes_output_that_is_not_utf8_cannot_be_json() -> None:
    response = InferenceResponse(outputs=[tensor("S", np.array([b"\xff"], dtype=object), "BYTES")])
    with pytest.raises(TritiumError, match="not valid UTF-8") as info:
        encode(response, outputs_request({}), "m", 1)
    assert info.value.code is ErrorCode.INTERNAL
    request = outputs_request({"parameters": {"binary_data_output": True}})
    headers, parts = encode(response, request, "m", 1)
    assert read_result(headers, parts).as_numpy("S").tolist() == [b"\xff"]


def test_bytes_output_accepts_str_and_fixed_width_arrays() -> None:
    response = InferenceResponse(outputs=[
        tensor("U", np.array(["ab", "c"]), "BYTES"), tensor("S", np.array([b"ab", b"c"]), "BYTES"),
    ])
    request = outputs_request({"parameters": {"binary_data_output": True}})
    result = read_result(*encode(response, request, "m", 1))
    assert result.as_numpy("U").tolist() == [b"ab", b"c"]
    assert result.as_numpy("S").tolist() == [b"ab", b"c"]


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_precision_outputs_must_be_binary(datatype: str) -> None:
    array = SAMPLES[datatype].view(np.uint16) if datatype == "BF16" else SAMPLES[datatype]
    response = InferenceResponse(outputs=[tensor("H", array, datatype)])
    expect_invalid(f"sending {datatype} data via JSON is not supported",
                   encode, response, outputs_request({}), "m", 1)


def test_output_shape_must_match_its_data() -> None:
    response = InferenceResponse(outputs=[Tensor("X", DataType.INT32, (3,), np.zeros(2, np.int32))])
    with pytest.raises(TritiumError, match="shape does not match") as info:
        encode(response, outputs_request({}), "m", 1)
    assert info.value.code is ErrorCode.INTERNAL


def test_classification_top_n() -> None:
    scores = np.array([[0.1, 0.7, 0.2], [0.5, 0.25, 0.75]], dtype=np.float32)
    response = InferenceResponse(outputs=[tensor("P", scores)])
    request = outputs_request({"outputs": [
        {"name": "P", "parameters": {"classification": 2, "binary_data": False}}]})
    response.served_by = ServedBy("m", 1, True, {"P": ["cat", "dog"]})  # set by the core
    _, parts = encode(response, request, "m", 1)
    (output,) = header_json(parts)["outputs"]
    assert output["datatype"] == "BYTES" and output["shape"] == [2, 2]
    assert output["data"] == ["0.700000:1:dog", "0.200000:2", "0.750000:2", "0.500000:0:cat"]
    ints = InferenceResponse(outputs=[tensor("I", np.array([3, 9, 1], dtype=np.int32))])
    request = outputs_request({"outputs": [{"name": "I", "parameters": {"classification": 5}}]})
    _, parts = encode(ints, request, "m", 1)
    assert header_json(parts)["outputs"][0]["data"] == ["9:1", "3:0", "1:2"]


def test_classification_of_bytes_is_refused() -> None:
    request = outputs_request({"outputs": [{"name": "C", "parameters": {"classification": 1}}]})
    expect_invalid("class result not available", encode, RESPONSE, request, "m", 1)


# ---------------------------------------------------------------- errors, compression


def test_encode_error() -> None:
    error = TritiumError(ErrorCode.INVALID_ARG, 'bad "quote"')
    assert orjson.loads(encode_error(error)) == {"error": 'bad "quote"'}


@pytest.mark.parametrize("encoding, pack", [("gzip", gzip.compress), ("deflate", zlib.compress)])
def test_decompress_body(encoding: str, pack: Any) -> None:
    data = b'{"inputs":[]}' * 50
    assert decompress_body(pack(data), encoding, 10_000) == data
    expect_invalid("--http-max-input-size", decompress_body, pack(data), encoding, 100)
    expect_invalid("failed to decompress", decompress_body, b"not compressed", encoding, 100)
    expect_invalid("truncated", decompress_body, pack(data)[:-8], encoding, 10_000)
    # Junk (or a second member) after the compressed data is not silently dropped.
    expect_invalid("bytes follow the compressed data", decompress_body,
                   pack(data) + b"junk", encoding, 10_000)


def test_decompress_identity_and_unknown() -> None:
    assert decompress_body(b"abc", None, 1) == b"abc"
    assert decompress_body(b"abc", "identity", 1) == b"abc"
    expect_invalid("unsupported Content-Encoding 'br'", decompress_body, b"abc", "br", 10)


@pytest.mark.parametrize(
    "accept, chosen",
    [
        (None, None),
        ("", None),
        ("gzip", "gzip"),
        ("deflate", "deflate"),
        ("br", None),
        ("gzip;q=0.5, deflate;q=0.8", "deflate"),
        ("identity, gzip;q=0.5", None),
        ("deflate;q=0.2, gzip", "gzip"),
        ("gzip;q=abc, deflate;q=0.1", "deflate"),
        ("gzip, deflate", "gzip"),
    ],
)
def test_choose_encoding(accept: str | None, chosen: str | None) -> None:
    assert choose_encoding(accept) == chosen


def test_compressed_response_reads_back_in_tritonclient() -> None:
    request = outputs_request({"parameters": {"binary_data_output": True}})
    headers, parts = encode(RESPONSE, request, "m", 1)
    for accept in ("gzip", "deflate"):
        encoding, packed = compress_response(parts, accept)
        assert encoding == accept and len(packed) == 1
        result = httpclient.InferResult.from_response_body(
            bytes(packed[0]), header_length=int(dict(headers)[HEADER_LENGTH]),
            content_encoding=encoding,
        )
        assert result.as_numpy("A").tolist() == [1.5, 2.5]
    assert compress_response(parts, None) == (None, parts)


# ------------------------------------------------------------- big requests and responses


@dataclasses.dataclass
class Model:
    """What the codec's checks read of a ModelHandle."""

    name: str = "m"
    max_batch_size: int = 0
    inputs: dict[str, TensorSpec] = dataclasses.field(default_factory=lambda: {
        "x": TensorSpec("x", DataType.FP32, (-1,))})


def handle(model: Model) -> ModelHandle:
    return cast(ModelHandle, model)


def test_inputs_are_checked_against_the_model_before_any_data_is_decoded() -> None:
    # Malformed BYTES data: the datatype error comes first, so it was never split.
    header = orjson.dumps({"inputs": [{"name": "x", "shape": [3], "datatype": "BYTES",
                                       "parameters": {"binary_data_size": 2}}]})
    with pytest.raises(TritiumError, match="data-type is 'BYTES', but model 'm' expects"):
        decode_infer_request(header + b"\x01\x00", len(header), "m", None, model=handle(Model()))
    for item, message in [
        ({"name": "y", "shape": [1], "datatype": "FP32", "data": [1]}, "unexpected inference"),
        ({"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1]}, "unexpected shape"),
    ]:
        with pytest.raises(TritiumError, match=message):
            decode_infer_request(orjson.dumps({"inputs": [item]}), None, "m", None,
                                 model=handle(Model()))
    batched = Model(max_batch_size=2)
    body = orjson.dumps({"inputs": [{"name": "x", "shape": [3, 1], "datatype": "FP32",
                                     "data": [1, 2, 3]}]})
    with pytest.raises(TritiumError, match="batch-size must be <= 2"):
        decode_infer_request(body, None, "m", None, model=handle(batched))


def test_a_request_checked_against_a_model_says_for_which() -> None:
    """The core trusts the per-input checks for that handle only (validation.py): a request
    decoded without a model, or a raw binary one, is checked again by the core."""
    body = orjson.dumps({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32",
                                     "data": [1, 2]}]})
    model = handle(Model())
    assert decode_infer_request(body, None, "m", None, model=model).checked_for is model
    assert decode_infer_request(body, None, "m", None).checked_for is None
    raw = decode_raw_binary_request(b"\x00" * 8, TensorSpec("x", DataType.FP32, (-1,)),
                                    False, "m", None)
    assert raw.checked_for is None


@pytest.mark.parametrize("shape, message", [
    ([1] * 65, "has 65 dimensions, more than the 64 allowed"),
    ([2**31, 2**31, 2**31], "more elements than a tensor can"),
    ([0, 2**40, 2**40], "more elements than a tensor can"),
])
def test_absurd_shapes_are_invalid(shape: list[int], message: str) -> None:
    for doc in ({"inputs": [{"name": "x", "shape": shape, "datatype": "FP32", "data": []}]},
                {"inputs": [{"name": "x", "shape": shape, "datatype": "FP32",
                             "parameters": {"binary_data_size": 0}}]}):
        expect_invalid(message, decode_json, doc)


def test_json_byte_size_is_checked_before_the_data_is_converted() -> None:
    # Nested data is only counted once flattened: the size from the shape refuses it first.
    doc = {"inputs": [{"name": "x", "shape": [2**40], "datatype": "FP32", "data": [[1]]}]}
    expect_invalid("has a byte_size", decode_json, doc)


def test_big_json_bodies_are_parsed_in_bounded_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    from tritium.frontends.http import json_pieces

    sizes: list[int] = []
    real = json_pieces._loads

    def recording(text: bytes) -> Any:
        sizes.append(len(text))
        return real(text)

    monkeypatch.setattr(json_pieces, "_loads", recording)
    values = list(range(400_000))
    body = orjson.dumps({"id": "big", "inputs": [
        {"name": "x", "shape": [len(values)], "datatype": "INT32", "data": values},
        {"name": "y", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2], [3, 4]]}]})
    request = decode_infer_request(body, None, "m", None)
    assert len(sizes) > 4 and max(sizes) < json_pieces.PIECE + 1024
    assert request.id == "big" and request.inputs["x"].data.tolist() == values
    assert request.inputs["y"].data.tolist() == [[1, 2], [3, 4]]


def test_big_json_outputs_match_the_small_path_and_can_be_streamed() -> None:
    from tritium.frontends.http.codec import stream_infer_response

    values = np.linspace(-1, 1, 100_003, dtype=np.float32)
    small = InferenceResponse(outputs=[tensor("A", values[:5])])
    big = InferenceResponse(outputs=[tensor("A", values), tensor("B", values[:3])])
    request = outputs_request({})
    headers, parts = encode(big, request, "m", 1)
    body = b"".join(bytes(part) for part in parts)
    assert orjson.loads(body)["outputs"][0]["data"] == values.tolist()
    expected = orjson.dumps({"model_name": "m", "model_version": "1", "outputs": [
        {"name": "A", "datatype": "FP32", "shape": [values.size], "data": values.tolist()},
        {"name": "B", "datatype": "FP32", "shape": [3], "data": values[:3].tolist()}]})
    assert body == expected and headers == [("Content-Type", JSON_CONTENT_TYPE)]
    big.served_by = ServedBy("m", 1, False, {})
    streamed_headers, pieces = stream_infer_response(big, request)
    assert not isinstance(pieces, list) and streamed_headers == headers
    assert b"".join(bytes(piece) for piece in pieces) == expected
    small.served_by = big.served_by
    assert isinstance(stream_infer_response(small, request)[1], list)


def test_big_half_float_outputs_are_refused_before_streaming() -> None:
    from tritium.frontends.http.codec import stream_infer_response

    response = InferenceResponse(outputs=[tensor("H", np.zeros(100_000, dtype=np.float16))],
                                 served_by=ServedBy("m", 1, False, {}))
    expect_invalid("FP16 data via JSON is not supported", stream_infer_response, response,
                   outputs_request({}))


@pytest.mark.parametrize("text", [
    b"[1," + b" " * 100 + b"]", b"[" + b" " * 100 + b",1]", b'{"a":' + b"\n" * 80 + b",1}",
    b"[1]" + b" " * 50 + b",[2]", b"[1,,2]", b'{"a":1,}',
])
def test_json_pieces_refuse_what_orjson_refuses(text: bytes) -> None:
    from tritium.frontends.http import json_pieces

    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(text)
    for piece in (1, 2, 3, 8):
        with pytest.raises(json_pieces.JsonError):
            json_pieces.loads(text, piece)


def test_json_pieces_keep_duplicate_keys_as_orjson_does() -> None:
    from tritium.frontends.http import json_pieces

    text = b'{"a":[1,2],"b":{"c":[3,4]},"a":[5,6],"b":{"c":[7, 8],"d":9}}'
    for piece in (1, 4, 9):
        assert orjson.dumps(json_pieces.loads(text, piece)) == orjson.dumps(orjson.loads(text))


def test_a_big_json_body_is_parsed_from_the_buffer_it_arrived_in() -> None:
    """A view of a whole body is parsed without copying it; a part of one is copied."""
    from tritium.frontends.http import json_pieces

    whole = bytearray(b'{"a": [' + b"1," * 400_000 + b"1]}")
    view = memoryview(whole).toreadonly()
    assert json_pieces._whole_buffer(view) is whole
    assert json_pieces._whole_buffer(view[:10]) == bytes(whole[:10])
    assert len(json_pieces.loads(view)["a"]) == 400_001
