"""Generate-extension codec: JSON keys to tensors and parameters, responses, SSE framing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pytest

from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.request import InferenceRequest
from tritium.core.response import InferenceResponse, ServedBy
from tritium.core.types import DataType, Tensor, TensorSpec
from tritium.frontends.http.generate import (
    decode_generate_request,
    encode_generate_response,
    generate_shape,
    sse_error,
    sse_event,
)


@dataclass
class FakeModel:
    """Just the ModelHandle attributes the generate codec reads."""

    name: str = "llm"
    max_batch_size: int = 0
    inputs: Mapping[str, TensorSpec] = field(default_factory=dict)
    outputs: Mapping[str, TensorSpec] = field(default_factory=dict)
    decoupled: bool = True


def model(max_batch_size: int = 0, *specs: TensorSpec) -> Any:
    return FakeModel(max_batch_size=max_batch_size, inputs={s.name: s for s in specs})


TEXT = TensorSpec("text_input", DataType.BYTES, (1,))
IDS = TensorSpec("ids", DataType.INT32, (-1,))
GRID = TensorSpec("grid", DataType.FP32, (-1, 2))
FLAG = TensorSpec("stream", DataType.BOOL, (1,))


def decode(doc: dict[str, Any] | bytes, handle: Any, **kwargs: Any) -> InferenceRequest:
    body = doc if isinstance(doc, bytes) else orjson.dumps(doc)
    return decode_generate_request(body, handle, None, **kwargs)


def expect_invalid(match: str, doc: dict[str, Any] | bytes, handle: Any) -> None:
    with pytest.raises(TritiumError, match=match) as info:
        decode(doc, handle)
    assert info.value.code is ErrorCode.INVALID_ARG


# ---------------------------------------------------------------- requests


def test_scalar_becomes_batch_one_tensor() -> None:
    request = decode({"text_input": "hi"}, model(8, TEXT))
    tensor = request.inputs["text_input"]
    assert tensor.shape == (1, 1)
    assert tensor.data.dtype == object and tensor.data.tolist() == [[b"hi"]]
    assert request.model_name == "llm" and request.parameters == {}


def test_list_fills_the_innermost_variable_dim() -> None:
    request = decode({"ids": [1, 2, 3]}, model(4, IDS))
    assert request.inputs["ids"].shape == (1, 3)
    assert request.inputs["ids"].data.tolist() == [[1, 2, 3]]
    request = decode({"ids": [1, 2, 3]}, model(0, IDS))
    assert request.inputs["ids"].shape == (3,)


def test_fixed_dims_divide_the_count() -> None:
    request = decode({"grid": [1, 2, 3, 4, 5, 6]}, model(0, GRID))
    assert request.inputs["grid"].shape == (3, 2)
    assert request.inputs["grid"].data.dtype == np.float32
    expect_invalid("The schema can not convert input 'grid' to tensor with proper shape",
                   {"grid": [1, 2, 3]}, model(0, GRID))
    expect_invalid("The schema can not convert input 'text_input'",
                   {"text_input": ["a", "b"]}, model(0, TEXT))


@pytest.mark.parametrize(
    "dims, count, shape",
    [
        ((-1, 1), 1, (1, 1)),
        ((-1, -1), 5, (1, 5)),
        ((-1, 2), 4, (2, 2)),
        ((2, -1, 3), 12, (2, 2, 3)),
        ((), 1, ()),
        ((-1,), 0, (0,)),
        ((3,), 2, None),
        ((2,), 4, None),
        ((0,), 1, None),
        ((2,), 0, None),
    ],
)
def test_generate_shape(dims: tuple[int, ...], count: int, shape: tuple[int, ...] | None) -> None:
    assert generate_shape(dims, count) == shape


def test_other_keys_become_parameters() -> None:
    request = decode(
        {"text_input": "hi", "max_tokens": 5, "temperature": 0.5, "stop": False, "mode": "x"},
        model(0, TEXT),
    )
    assert request.parameters == {"max_tokens": 5, "temperature": 0.5, "stop": False, "mode": "x"}


def test_parameters_object_maps_like_top_level_keys() -> None:
    request = decode({"parameters": {"stream": True, "top_k": 3}}, model(0, FLAG))
    assert request.inputs["stream"].data.tolist() == [True]
    assert request.parameters == {"top_k": 3}


def test_id_is_the_request_id_and_a_parameter() -> None:
    request = decode({"id": "r-1", "text_input": "x"}, model(0, TEXT))
    assert request.id == "r-1"
    assert request.parameters == {"id": "r-1"}
    expect_invalid("Unable to parse 'id'", {"id": 3}, model(0, TEXT))


def test_empty_body_is_an_empty_request() -> None:
    request = decode(b"", model(0, TEXT))
    assert request.inputs == {} and request.parameters == {} and request.id == ""


@pytest.mark.parametrize(
    "doc, match",
    [
        (b"{", "failed to parse the request JSON"),
        (b"[]", "not an object"),
        ({"max_tokens": [1, 2]}, "parameter 'max_tokens' has invalid type"),
        ({"max_tokens": {"a": 1}}, "invalid type"),
        ({"parameters": 3}, "Expected JSON object for keyword: 'parameters'"),
        ({"parameters": {"bad": None}}, "Converting keyword: 'parameters': parameter 'bad'"),
        ({"ids": [1.5]}, "attempt to access JSON non-signed-integer as signed-integer"),
        ({"ids": [[1, 2]]}, "attempt to access JSON non-signed-integer as signed-integer"),
        ({"stream": 1}, "attempt to access JSON non-boolean as boolean"),
    ],
)
def test_bad_generate_requests(doc: dict[str, Any] | bytes, match: str) -> None:
    expect_invalid(match, doc, model(0, IDS, FLAG))


@pytest.mark.parametrize("doc, match", [
    # Triton's generate_endpoint_test: each value in the body's order, in Triton's words.
    ({"text_input": 123, "stream": False}, "attempt to access JSON non-string as string"),
    ({"text_input": "hello", "stream": "false"}, "attempt to access JSON non-boolean as boolean"),
    ({"text_input": True, "stream": 123}, "attempt to access JSON non-string as string"),
    ({"stream": 123, "text_input": True}, "attempt to access JSON non-boolean as boolean"),
    ({"text_input": {"USER": "hello", "BOT": "world"}, "stream": True},
     "attempt to access JSON non-string as string"),
])
def test_values_of_the_wrong_json_type(doc: dict[str, Any], match: str) -> None:
    expect_invalid(match, doc, model(0, TEXT, FLAG))


def test_half_precision_inputs_are_refused() -> None:
    half = TensorSpec("h", DataType.FP16, (-1,))
    expect_invalid("FP16 data via JSON is not supported", {"h": [1.0]}, model(0, half))


def test_input_named_parameters_conflicts_with_the_nested_object() -> None:
    clash = TensorSpec("parameters", DataType.INT32, (1,))
    expect_invalid("Keyword 'parameters' for nested schema", {"parameters": {}}, model(0, clash))


@pytest.mark.parametrize("body, repeated", [
    (b'{"text_input": "a", "stream": false, "text_input": "b"}', "text_input"),
    (b'{"text_input": "a", "stream": false, "stream": true, "text_input": "b"}', "stream"),
    (b'{"text_input": "a", "parameters": {"text_input": "b"}}', "text_input"),
    (b'{"text_input": "a", "\\u0074ext_input": "b"}', "text_input"),
    (b'{"text_input": "text_input", "text_input": "b"}', "text_input"),
])
def test_an_input_given_twice_is_refused(body: bytes, repeated: str) -> None:
    """Triton adds each generate member as an input when it reaches it, in the order
    written, and the second add of one name fails with "input '<name>' already exists in
    request" (its request-id prefix included); the first repeat is the one named."""
    expect_invalid(rf"^\[request id: <id_unknown>\] input '{repeated}' already exists in "
                   "request$", body, model(0, TEXT, FLAG))


def test_a_name_repeated_only_inside_values_is_one_input() -> None:
    body = b'{"text_input": "say \\"text_input\\"", "note": "text_input"}'
    request = decode(body, model(0, TEXT))
    assert request.inputs["text_input"].data.tolist() == [b'say "text_input"']
    assert request.parameters == {"note": "text_input"}


def test_input_size_limit() -> None:
    with pytest.raises(TritiumError, match="--http-max-input-size"):
        decode({"ids": list(range(10))}, model(0, IDS), max_input_size=16)
    with pytest.raises(TritiumError, match="--http-max-input-size"):
        decode({"text_input": "é" * 5}, model(0, TEXT), max_input_size=13)
    assert decode({"text_input": "é" * 5}, model(0, TEXT), max_input_size=14).inputs


# ---------------------------------------------------------------- responses


def encode(response: InferenceResponse, request: InferenceRequest, name: str,
           version: int) -> bytes:
    """Encode as for a response the core delivered from version ``version`` of ``name``."""
    response.served_by = ServedBy(name, version, False, {})
    return encode_generate_response(response, request)


def test_response_has_metadata_parameters_and_outputs_as_keys() -> None:
    request = InferenceRequest(model_name="llm", inputs={}, id="r-1")
    response = InferenceResponse(
        outputs=[
            Tensor("text_output", DataType.BYTES, (1, 1), np.array([[b"hello"]], dtype=object)),
            Tensor("logits", DataType.FP32, (1, 3), np.array([[0.5, 1, 2]], dtype=np.float32)),
            Tensor("done", DataType.BOOL, (1,), np.array([True])),
        ],
        parameters={"tokens": 7},
    )
    body = encode(response, request, "llm", 2)
    assert orjson.loads(body) == {
        "id": "r-1", "model_name": "llm", "model_version": "2", "tokens": 7,
        "text_output": "hello", "logits": [0.5, 1.0, 2.0], "done": True,
    }
    # Triton writes the keys in sorted order.
    assert body.startswith(b'{"done":true,"id":"r-1","logits"')


def test_response_without_id_and_name_clashes() -> None:
    request = InferenceRequest(model_name="llm", inputs={})
    response = InferenceResponse(
        outputs=[Tensor("model_name", DataType.INT32, (1,), np.array([1], dtype=np.int32)),
                 Tensor("p", DataType.INT32, (1,), np.array([1], dtype=np.int32))],
        parameters={"p": "param wins"},
    )
    doc = orjson.loads(encode(response, request, "llm", 1))
    assert doc == {"model_name": "llm", "model_version": "1", "p": "param wins"}


def test_response_errors() -> None:
    request = InferenceRequest(model_name="llm", inputs={})
    bad_text = Tensor("t", DataType.BYTES, (1,), np.array([b"\xff"], dtype=object))
    with pytest.raises(TritiumError, match="UTF-8"):
        encode(InferenceResponse(outputs=[bad_text]), request, "llm", 1)
    half = Tensor("h", DataType.FP16, (1,), np.array([1], dtype=np.float16))
    with pytest.raises(TritiumError, match="FP16"):
        encode(InferenceResponse(outputs=[half]), request, "llm", 1)


def test_sse_framing() -> None:
    assert sse_event(b'{"a":1}') == b'data: {"a":1}\n\n'
    error = TritiumError(ErrorCode.INTERNAL, "boom")
    frame = sse_error(error)
    assert frame.startswith(b"data: ") and frame.endswith(b"\n\n")
    assert orjson.loads(frame[6:-2]) == {"error": "boom"}


def test_big_outputs_are_written_as_the_small_ones_are() -> None:
    request = InferenceRequest(model_name="llm", inputs={})
    values = np.arange(70_000, dtype=np.int32)
    response = InferenceResponse(outputs=[
        Tensor("ids", DataType.INT32, (values.size,), values),
        Tensor("a", DataType.FP32, (2,), np.array([0.5, 1], dtype=np.float32)),
        Tensor("z", DataType.INT32, (values.size,), values[::-1].copy())])
    body = encode(response, request, "llm", 1)
    assert body == orjson.dumps({"a": [0.5, 1.0], "ids": values.tolist(), "model_name": "llm",
                                 "model_version": "1", "z": values[::-1].tolist()})
