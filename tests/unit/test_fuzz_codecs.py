"""Property-based fuzzing of the codecs: whatever a client sends, the result is a decoded
request or a TritiumError a client is owed (INVALID_ARG; NOT_FOUND for a shared memory
region that is not registered; UNSUPPORTED),
never another exception."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import orjson
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.model import ModelHandle
from tritium.core.request import InferenceRequest
from tritium.core.serialization import bytes_from_binary, serialize_bytes
from tritium.core.types import DataType, TensorSpec
from tritium.core.validation import validate_request
from tritium.frontends.grpc import codec as grpc_codec
from tritium.frontends.http import codec as http_codec
from tritium.frontends.http import generate, json_pieces

FUZZ = settings(max_examples=100, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
CLIENT_CODES = {ErrorCode.INVALID_ARG, ErrorCode.NOT_FOUND, ErrorCode.UNSUPPORTED}
WIRE_NAMES = [t.wire for t in DataType] + ["", "FP8", "bytes", "TYPE_FP32"]


@dataclass
class FakeModel:
    """The part of a ModelHandle the codecs and validation read."""

    name: str = "m"
    max_batch_size: int = 0
    inputs: dict[str, TensorSpec] = field(default_factory=dict)
    outputs: dict[str, TensorSpec] = field(default_factory=dict)


MODELS = [cast(ModelHandle, model) for model in (
    FakeModel(inputs={"x": TensorSpec("x", DataType.FP32, (-1,))},
              outputs={"y": TensorSpec("y", DataType.FP32, (-1,))}),
    FakeModel(max_batch_size=4, inputs={
        "x": TensorSpec("x", DataType.BYTES, (2,)),
        "z": TensorSpec("z", DataType.INT8, (-1, 3), optional=True, reshape=(3, -1))}),
)]


def outcome(decode: Callable[[], InferenceRequest], model: ModelHandle | None = None) -> None:
    """Run a decode (and validation against ``model``); only client errors may escape."""
    try:
        request = decode()
        if model is not None:
            validate_request(request, model)
    except TritiumError as exc:
        assert exc.code in CLIENT_CODES, exc
        return
    assert isinstance(request, InferenceRequest)
    for tensor in request.inputs.values():
        assert tensor.data.shape == tensor.shape


# ------------------------------------------------------------------------------- JSON

scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=4),
                           max_leaves=30)
shapes = st.lists(st.integers(-2, 5), max_size=4) | st.lists(st.integers(0, 2**62), max_size=3) \
    | st.just([1] * 65) | json_values


# Mostly well-formed, so that fuzzing gets past the first check: names the models declare,
# their datatypes, small shapes, data that matches the shape; wrong now and then.
names = st.sampled_from(["x", "x", "z", "w"]) | st.text(max_size=3)
wire_names = st.sampled_from(["FP32", "FP32", "BYTES", "BYTES", "INT8", "FP16"]) \
    | st.sampled_from(WIRE_NAMES)
small_shapes = st.lists(st.integers(0, 3), min_size=1, max_size=3)
shapes = small_shapes | small_shapes | st.lists(st.integers(-2, 2**62), max_size=3) \
    | st.just([1] * 65) | json_values
_ELEMENTS = {
    "FP32": st.floats(allow_nan=False, allow_infinity=False, width=32) | st.integers(-9, 9),
    "INT8": st.integers(-130, 130), "BYTES": st.text(max_size=3), "BOOL": st.booleans(),
}


def _count(shape: Any) -> int:
    if type(shape) is not list or not all(type(d) is int and 0 <= d < 8 for d in shape):
        return 1
    return int(np.prod(shape))


@st.composite
def _input(draw: st.DrawFn, binary: bytearray) -> dict[str, Any]:
    item: dict[str, Any] = {"name": draw(names), "datatype": draw(wire_names),
                            "shape": draw(shapes)}
    count = _count(item["shape"]) + draw(st.sampled_from([0, 0, 0, 1]))
    elements = _ELEMENTS.get(item["datatype"], scalars) | scalars
    if draw(st.booleans()):
        data = draw(st.lists(elements, min_size=count, max_size=count))
        item["data"] = draw(st.sampled_from([data, data, [data], {"a": data}]))
    else:
        blob = _blob(draw, item["datatype"], count)
        size = draw(st.sampled_from([len(blob), len(blob), len(blob) + 1, -1, "4"]))
        item["parameters"] = {"binary_data_size": size}
        binary += blob
    if draw(st.integers(0, 5)) == 5:
        item.setdefault("parameters", {}).update(draw(st.dictionaries(
            st.sampled_from(["shared_memory_region", "binary_data_size", "k"]),
            json_values, max_size=2)))
    return item


def _blob(draw: st.DrawFn, datatype: str, count: int) -> bytes:
    wire = DataType.from_wire(datatype)
    if wire is DataType.BYTES:
        array = np.empty(count, dtype=object)
        array[:] = draw(st.lists(st.binary(max_size=4), min_size=count, max_size=count))
        return serialize_bytes(array)[: draw(st.sampled_from([None, None, None, -1]))]
    if wire is None or draw(st.integers(0, 4)) == 4:
        return draw(st.binary(max_size=40))
    return draw(st.binary(min_size=count * wire.itemsize, max_size=count * wire.itemsize))


@st.composite
def infer_documents(draw: st.DrawFn) -> tuple[dict[str, Any], bytes]:
    """A plausible /infer document with its binary section, wrong in random places."""
    binary = bytearray()
    doc: dict[str, Any] = {"inputs": [draw(_input(binary))
                                      for _ in range(draw(st.integers(0, 3)))]}
    if draw(st.booleans()):
        doc["outputs"] = draw(st.lists(st.fixed_dictionaries(
            {"name": st.sampled_from(["y", "q"])},
            optional={"parameters": st.dictionaries(
                st.sampled_from(["binary_data", "classification", "shared_memory_region"]),
                st.booleans() | st.integers(-1, 3), max_size=2)}), max_size=2) | json_values)
    if draw(st.integers(0, 2)) == 2:
        doc["parameters"] = draw(st.dictionaries(
            st.sampled_from(["binary_data_output", "priority", "timeout", "sequence_id",
                             "headers", "custom"]),
            st.booleans() | st.integers(-1, 5) | json_values, max_size=3))
    # Hypothesis favours the simplest draw (0): the rare branches take the largest one.
    if draw(st.integers(0, 4)) == 4:
        doc["id"] = draw(json_values)
    return doc, bytes(binary)


@FUZZ
@given(st.binary(max_size=300), st.none() | st.integers(-2, 310))
def test_http_decode_of_arbitrary_bytes(body: bytes, header_length: int | None) -> None:
    outcome(lambda: http_codec.decode_infer_request(body, header_length, "m", None,
                                                    max_input_size=1 << 16))


@FUZZ
@given(infer_documents(), st.sampled_from([None, *MODELS]), st.booleans())
def test_http_decode_of_documents(document: tuple[dict[str, Any], bytes],
                                  model: ModelHandle | None, header: bool) -> None:
    doc, binary = document
    text = json.dumps(doc).encode()
    length = len(text) if header or binary else None
    outcome(lambda: http_codec.decode_infer_request(
        text + binary, length, "m", None, max_input_size=1 << 16,
        model=model),
        model)


@FUZZ
@given(st.binary(max_size=64), st.sampled_from(list(DataType)),
       st.lists(st.integers(-1, 4), max_size=3), st.booleans())
def test_http_raw_binary_decode(body: bytes, datatype: DataType, dims: list[int],
                                batched: bool) -> None:
    spec = TensorSpec("x", datatype, tuple(dims))
    outcome(lambda: http_codec.decode_raw_binary_request(body, spec, batched, "m", None))


@FUZZ
@given(json_values | st.dictionaries(st.sampled_from(["x", "text", "parameters", "id"]),
                                     json_values, max_size=4), st.sampled_from(MODELS))
def test_generate_decode(doc: Any, model: ModelHandle) -> None:
    body = json.dumps(doc).encode()
    outcome(lambda: generate.decode_generate_request(body, model, None),
            model)


@settings(max_examples=200, deadline=None, database=None)
@given(json_values, st.integers(1, 48),
       st.binary(max_size=3) | st.sampled_from([b" " * 70, b"\n,", b", ", b"]" + b" " * 70]),
       st.integers(0, 400))
def test_json_pieces_agree_with_orjson(value: Any, piece: int, junk: bytes, at: int) -> None:
    """Parsed in pieces or at once, a document gives the same value (keys in the same
    order) or fails both ways; junk spliced in makes most documents invalid."""
    text = json.dumps(value).encode()  # orjson itself refuses integers beyond 64 bits
    for candidate in (text, text[:at] + junk + text[at:]):
        try:
            expected: Any = orjson.dumps(orjson.loads(candidate))
        except orjson.JSONDecodeError:
            expected = None
        try:
            got: Any = orjson.dumps(json_pieces.loads(candidate, piece))
        except json_pieces.JsonError:
            got = None
        assert got == expected, (candidate, piece)


@FUZZ
@given(json_values, st.integers(1, 48), st.integers(0, 200))
def test_json_pieces_count_values_before_building_them(value: Any, piece: int,
                                                       most: int) -> None:
    """With a bound on brackets and commas outside strings, a document within it parses
    as orjson parses it, and one past it is refused as too many values (when it is longer
    than a piece; shorter ones are cheap whatever they hold)."""
    text = json.dumps(value).encode()
    tokens = _structural_tokens(value)
    try:
        got = json_pieces.loads(text, piece, max_tokens=most)
    except json_pieces.TooManyValues:
        assert tokens > most and len(text) > piece
        return
    assert tokens <= most or len(text) <= piece
    assert orjson.dumps(got) == orjson.dumps(orjson.loads(text))


def _structural_tokens(value: Any) -> int:
    """Brackets and commas json.dumps writes for ``value``."""
    if isinstance(value, list):
        return 2 + max(len(value) - 1, 0) + sum(map(_structural_tokens, value))
    if isinstance(value, dict):
        return 2 + max(len(value) - 1, 0) + sum(map(_structural_tokens, value.values()))
    return 0


# ----------------------------------------------------------------------------- binary

@FUZZ
@given(st.binary(max_size=200), st.integers(0, 80))
def test_bytes_split_of_arbitrary_bytes(raw: bytes, count: int) -> None:
    try:
        array = bytes_from_binary(raw, count, "for input 'x'")
    except TritiumError as exc:
        assert exc.code is ErrorCode.INVALID_ARG
        return
    assert array.shape == (count,) and serialize_bytes(array) == raw


@FUZZ
@given(st.lists(st.binary(max_size=6) | st.sampled_from([b"", b"ab", b"\x00"]), max_size=300))
def test_bytes_round_trip(elements: list[bytes]) -> None:
    array = np.empty(len(elements), dtype=object)
    array[:] = elements
    raw = serialize_bytes(array)
    assert bytes_from_binary(raw, len(elements), "x").tolist() == elements
    assert bytes_from_binary(memoryview(raw), len(elements), "x").tolist() == elements


# ------------------------------------------------------------------------------- gRPC

@st.composite
def infer_messages(draw: st.DrawFn) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(
        model_name="m", id=draw(st.text(max_size=4)),
        model_version=draw(st.sampled_from(["", "1", "", "", "x", "99999999999999999999"])))
    raw = draw(st.booleans())
    for _ in range(draw(st.integers(0, 3))):
        shape = draw(small_shapes | small_shapes | st.lists(st.integers(-2, 2**62), max_size=3)
                     | st.just([1] * 65))
        item = message.inputs.add(name=draw(names), datatype=draw(wire_names), shape=shape)
        count = _count(shape) + draw(st.sampled_from([0, 0, 0, 1]))
        if raw:
            message.raw_input_contents.append(_blob(draw, item.datatype, count))
        else:
            _fill_contents(draw, item.contents, count)
        if draw(st.integers(0, 5)) == 5:
            item.parameters[draw(st.sampled_from(["shared_memory_region", "k"]))].int64_param = 1
    if draw(st.booleans()) and raw:
        message.raw_input_contents.append(b"extra")
    for _ in range(draw(st.integers(0, 2))):
        output = message.outputs.add(name=draw(st.sampled_from(["y", "q"])))
        if draw(st.booleans()):
            _fill_parameter(draw, output.parameters["classification"])
    for key in draw(st.lists(st.sampled_from(
            ["priority", "timeout", "sequence_id", "sequence_start", "headers", "custom",
             "triton_enable_empty_final_response"]), max_size=2 * (draw(st.integers(0, 2)) == 2))):
        _fill_parameter(draw, message.parameters[key])
    return message


def _fill_contents(draw: st.DrawFn, contents: Any, count: int) -> None:
    kind = draw(st.sampled_from(["fp32", "fp32", "bytes", "bytes", "int", "int64", "uint",
                                 "uint64", "fp64", "bool", "none"]))
    if kind == "none":
        return
    values = {
        "int": st.integers(-(2**31), 2**31 - 1), "int64": st.integers(-(2**63), 2**63 - 1),
        "uint": st.integers(0, 2**32 - 1), "uint64": st.integers(0, 2**64 - 1),
        "fp32": st.floats(width=32), "fp64": st.floats(), "bool": st.booleans(),
        "bytes": st.binary(max_size=5),
    }[kind]
    getattr(contents, f"{kind}_contents").extend(
        draw(st.lists(values, min_size=count, max_size=count) | st.lists(values, max_size=8)))


def _fill_parameter(draw: st.DrawFn, param: Any) -> None:
    choice = draw(st.sampled_from(["bool", "int64", "uint64", "string", "double", "unset"]))
    if choice == "bool":
        param.bool_param = draw(st.booleans())
    elif choice == "int64":
        param.int64_param = draw(st.integers(-(2**63), 2**63 - 1))
    elif choice == "uint64":
        param.uint64_param = draw(st.integers(0, 2**64 - 1))
    elif choice == "string":
        param.string_param = draw(st.text(max_size=4))
    elif choice == "double":
        param.double_param = draw(st.floats())


@FUZZ
@given(infer_messages(), st.sampled_from([None, *MODELS]))
def test_grpc_decode_of_messages(message: pb.ModelInferRequest,
                                 model: ModelHandle | None) -> None:
    outcome(lambda: grpc_codec.decode_infer_request(message, model),
            model)


@FUZZ
@given(st.binary(max_size=200))
def test_grpc_decode_of_arbitrary_bytes(data: bytes) -> None:
    try:
        message = pb.ModelInferRequest.FromString(data)
    except DecodeError:
        return  # the transport answers these before any codec sees them
    outcome(lambda: grpc_codec.decode_infer_request(message, MODELS[0]),
            MODELS[0])


def test_byte_counts_in_messages_are_checked_before_decoding() -> None:
    message = pb.ModelInferRequest(model_name="m", raw_input_contents=[struct.pack("<I", 0)])
    message.inputs.add(name="x", datatype="BYTES", shape=[2])
    try:
        grpc_codec.decode_infer_request(message, MODELS[0])
    except TritiumError as exc:
        assert exc.code is ErrorCode.INVALID_ARG
        assert "data-type is 'BYTES', but model 'm' expects 'FP32'" in exc.message
    else:
        raise AssertionError("a BYTES input for an FP32 model was decoded")


def test_json_pieces_let_a_reader_stop_the_parse_early() -> None:
    """``progress`` sees the document grow piece by piece; raising stops the parse there."""
    from tritium.frontends.http.inputs import refuse_overflowing_data

    text = json.dumps({"inputs": [{"name": "x", "shape": [3], "datatype": "FP32",
                                   "data": list(range(20_000))}]}).encode()
    seen: list[int] = []

    def progress(doc: Any) -> None:
        seen.append(len(doc["inputs"][0]["data"]))
        refuse_overflowing_data(doc)

    with pytest.raises(TritiumError, match="Shape does not match"):
        json_pieces.loads(text, 1024, progress=progress)
    assert seen == [seen[0]] and 3 < seen[0] < 20_000  # stopped after the first piece
    fitting = {"inputs": [{"name": "x", "shape": [2, 10_000], "datatype": "FP32",
                           "data": list(range(20_000))}]}
    assert json_pieces.loads(json.dumps(fitting).encode(), 1024,
                             progress=refuse_overflowing_data) == fitting
