"""Generate-extension codec: flat JSON objects to requests, responses to JSON and SSE events."""

from __future__ import annotations

import json
import math
import secrets
from typing import Any

import numpy as np
import orjson

from tritium.core import messages
from tritium.core.errors import ErrorCode, TritiumError, invalid
from tritium.core.model import ModelHandle
from tritium.core.request import InferenceRequest
from tritium.core.response import InferenceResponse
from tritium.core.serialization import SLICE
from tritium.core.types import DataType, Tensor, TensorSpec
from tritium.frontends.http.codec import (
    DEFAULT_MAX_INPUT_SIZE,
    parse_json_object,
    scalar_parameter,
)
from tritium.frontends.http.tensor_data import array_from_json, json_pieces_of, json_values

SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"
# A key whose value is an object of more keys, each mapped like a top-level key.
NESTED_KEY = "parameters"


class _InputBudget:
    """Bytes of input data accepted so far, against --http-max-input-size."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0

    def spend(self, name: str, byte_size: int) -> None:
        if self.used + byte_size > self.limit:
            raise invalid(
                f"request size of {self.used} bytes with input '{name}' of size {byte_size} "
                f"bytes exceeds the maximum allowed input size of {self.limit}. Use "
                "--http-max-input-size to increase the limit."
            )
        self.used += byte_size


def decode_generate_request(
    body: bytes | bytearray | memoryview,
    model: ModelHandle,
    model_version: int | None,
    *,
    max_input_size: int = DEFAULT_MAX_INPUT_SIZE,
) -> InferenceRequest:
    """Map a generate body onto ``model``: input names become tensors, other keys
    become request parameters."""
    doc = parse_json_object(body) if len(body) else {}
    request = InferenceRequest(model_name=model.name, inputs={}, model_version=model_version)
    request_id = doc.get("id", "")
    if type(request_id) is not str:
        raise invalid(messages.JSON_NOT_STRING.format(key="id"))
    request.id = request_id
    _refuse_repeated_inputs(body, doc, model, request)
    budget = _InputBudget(max_input_size)
    for key, value in doc.items():
        if key == NESTED_KEY:
            _map_nested(request, model, value, budget)
        else:
            _map_key(request, model, key, value, budget)
    return request


class _Pairs(list[tuple[str, Any]]):
    """An object's members in the order written, repeats kept (orjson keeps the last)."""


def _refuse_repeated_inputs(body: bytes | bytearray | memoryview, doc: dict[str, Any],
                            model: ModelHandle, request: InferenceRequest) -> None:
    """INVALID_ARG when an input name is given twice, top-level or under ``parameters``:
    Triton adds each member as it reads it, and a second add of one input is refused."""
    nested = doc.get(NESTED_KEY)
    names = [key for key in doc if key in model.inputs]
    if type(nested) is dict:
        names += [key for key in nested if key in model.inputs]
    if not names or _written_once(bytes(body), names):
        return
    seen: set[str] = set()
    for name in _member_names(bytes(body)):
        if name in model.inputs:
            if name in seen:
                raise invalid(f"[request id: {request.describe()}] input '{name}' already "
                              "exists in request")
            seen.add(name)


def _written_once(body: bytes, names: list[str]) -> bool:
    """True when each name can only be one member: without a backslash in the body, a key
    is written exactly as orjson writes it, so one occurrence of that text is one member.
    A C scan per name; a repeat, or the name in a value, needs the exact walk."""
    return b"\\" not in body and len(set(names)) == len(names) and all(
        body.count(orjson.dumps(name)) == 1 for name in names)


def _member_names(body: bytes) -> list[str]:
    """The top-level member names in the order written, repeats kept, with those of
    ``parameters`` in its place (Triton maps them when it reaches that key)."""
    names: list[str] = []
    try:
        top = json.loads(body, object_pairs_hook=_Pairs)
    except (RecursionError, ValueError) as exc:  # orjson took it: only deep or odd numbers
        raise invalid(f"failed to parse the request JSON buffer: {type(exc).__name__}") from None
    for key, value in top:
        if key == NESTED_KEY and isinstance(value, _Pairs):
            names += [nested for nested, _ in value]
        else:
            names.append(key)
    return names


def _map_nested(
    request: InferenceRequest, model: ModelHandle, value: Any, budget: _InputBudget
) -> None:
    if NESTED_KEY in model.inputs:
        raise invalid(
            f"Keyword '{NESTED_KEY}' for nested schema also given as input tensor name"
        )
    if type(value) is not dict:
        raise invalid(f"Expected JSON object for keyword: '{NESTED_KEY}'")
    try:
        for key, item in value.items():
            _map_key(request, model, key, item, budget)
    except TritiumError as exc:
        raise TritiumError(exc.code, f"Converting keyword: '{NESTED_KEY}': {exc.message}") from None


def _map_key(
    request: InferenceRequest, model: ModelHandle, key: str, value: Any, budget: _InputBudget
) -> None:
    spec = model.inputs.get(key)
    if spec is None:
        request.parameters[key] = scalar_parameter(key, value)
        return
    tensor = _tensor(spec, model.max_batch_size > 0, value, budget)
    request.inputs[key] = tensor


def _tensor(spec: TensorSpec, batched: bool, value: Any, budget: _InputBudget) -> Tensor:
    elements = value if type(value) is list else [value]
    # Arrays inside arrays cannot be laid out: the model's shape is the only guide.
    data = array_from_json(elements, spec.datatype, spec.name)
    budget.spend(spec.name, _byte_size(spec.datatype, data))
    dims = ((-1,) if batched else ()) + spec.dims
    shape = generate_shape(dims, len(elements))
    if shape is None:
        raise invalid(
            f"The schema can not convert input '{spec.name}' to tensor with proper shape"
        )
    return Tensor(spec.name, spec.datatype, shape, data.reshape(shape))


def _byte_size(datatype: DataType, data: np.ndarray) -> int:
    if datatype is not DataType.BYTES:
        return data.nbytes
    # Serialized size: a 4-byte length before each element.
    return sum(map(len, data.tolist())) + 4 * data.size


def generate_shape(dims: tuple[int, ...], count: int) -> tuple[int, ...] | None:
    """Lay ``count`` values out on ``dims`` (-1 = variable) as Triton's generate does:
    fixed dims must divide the count, the innermost -1 takes what remains, other -1 are 1.
    None when the count does not fit."""
    remaining = count
    for dim in dims:
        if dim > 0:
            if remaining % dim:
                return None
            remaining //= dim
    shape = list(dims)
    for axis in range(len(shape) - 1, -1, -1):
        if shape[axis] == -1:
            shape[axis] = remaining
            remaining = 1
    return tuple(shape) if math.prod(shape) == count else None


def encode_generate_response(response: InferenceResponse, request: InferenceRequest) -> bytes:
    """One generate response: metadata, response parameters and outputs as top-level keys;
    the model version is the one ``response.served_by`` names."""
    served = response.served_by
    version = request.model_version if served is None else served.version
    doc: dict[str, Any] = {}
    if request.id:
        doc["id"] = request.id
    doc["model_name"] = request.model_name if served is None else served.model_name
    doc["model_version"] = "" if version is None else str(version)
    # Earlier keys win a name clash: metadata, then parameters, then outputs.
    for key, value in response.parameters.items():
        doc.setdefault(key, value)
    # A big output is written a slice at a time and put in place of a marker afterwards.
    big: dict[str, Tensor] = {}
    nonce = ""
    for tensor in response.outputs:
        if tensor.name in doc:
            continue
        if tensor.element_count > SLICE:
            nonce = nonce or secrets.token_hex(8)
            marker = f"\x00tritium-data:{nonce}:{len(big)}"
            big[marker] = tensor
            doc[tensor.name] = marker
        else:
            values = json_values(tensor)
            doc[tensor.name] = values[0] if len(values) == 1 else values
    try:
        text = orjson.dumps(doc, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError as exc:
        raise TritiumError(
            ErrorCode.INTERNAL, f"failed to write the generate response JSON: {exc}"
        ) from None
    for marker, tensor in big.items():
        text = text.replace(orjson.dumps(marker), b"".join(json_pieces_of(tensor)), 1)
    return text


def sse_event(payload: bytes) -> bytes:
    """One server-sent event carrying ``payload``."""
    return b"data: " + payload + b"\n\n"


def sse_error(error: TritiumError) -> bytes:
    """An error as a server-sent event."""
    return sse_event(orjson.dumps({"error": error.message}))
