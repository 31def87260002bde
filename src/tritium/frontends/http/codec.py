"""HTTP infer codec: KServe v2 JSON and binary-tensor bodies to core objects and back."""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from tritium.core import messages
from tritium.core.classification import classify
from tritium.core.errors import ErrorCode, TritiumError, invalid
from tritium.core.model import ModelHandle
from tritium.core.parameters import (
    ValueNames,
    apply_known_parameter,
    parse_bool,
    parse_unsigned,
    refuse_reserved,
)
from tritium.core.request import InferenceRequest, ParamValue, RequestedOutput
from tritium.core.response import InferenceResponse
from tritium.core.serialization import SLICE, bytes_array, tensor_bytes
from tritium.core.shared_memory import SharedMemoryRegistry, Slice
from tritium.core.types import DataType, Tensor, TensorSpec
from tritium.frontends.http import json_pieces
from tritium.frontends.http import shared_memory as shm
from tritium.frontends.http.inputs import (
    HEADER_LENGTH,
    BinaryReader,
    decode_input,
    field_error,
    plan_inputs,
    refuse_overflowing_data,
    tensor_from_binary,
)
from tritium.frontends.http.tensor_data import (
    InputLabel,
    Part,
    json_pieces_of,
    json_values,
    refuse_half_floats,
)

JSON_CONTENT_TYPE = "application/json"
BINARY_CONTENT_TYPE = "application/octet-stream"
DEFAULT_MAX_INPUT_SIZE = 64 * 1024 * 1024
_JSON_TYPE = ("Content-Type", JSON_CONTENT_TYPE)
_BINARY_TYPE = ("Content-Type", BINARY_CONTENT_TYPE)

Body = bytes | bytearray | memoryview


@dataclass(slots=True)
class HttpOutputOptions:
    """What the HTTP request said about output encoding, kept in ``frontend_state``."""

    binary_data_output: bool = False  # default for outputs the request did not list
    # Outputs to write into shared memory regions instead of the response, by name.
    shm_outputs: dict[str, Slice] | None = None
    # The outputs the request lists, by name, with their parameters (None: it lists none):
    # gathered as they are decoded, so that encoding the response need not gather them.
    # Not compared: it repeats the request's ``requested_outputs``.
    listed: dict[str, dict[str, ParamValue]] | None = field(default=None, compare=False)


_JSON_OUTPUTS = HttpOutputOptions(binary_data_output=False)


# --------------------------------------------------------------------------- request


def decode_infer_request(
    body: Body,
    header_length: int | None,
    model_name: str,
    model_version: int | None,
    *,
    max_input_size: int = DEFAULT_MAX_INPUT_SIZE,
    model: ModelHandle | None = None,
    shared_memory: SharedMemoryRegistry | None = None,
) -> InferenceRequest:
    """Decode an ``/infer`` body; ``header_length`` is Inference-Header-Content-Length.

    With ``model``, each input is checked against its configuration (declared, datatype,
    shape, batch size) before any input's data is decoded. Tensors whose parameters name
    a ``shared_memory`` region are read from (outputs: written to) it.
    """
    view = memoryview(body)
    json_end = _json_header_end(len(view), header_length, max_input_size)
    doc = parse_json_object(view[:json_end] if json_end != len(view) else view,
                            refuse_overflowing_data)
    # Positional: keywords would build a dict for the class call, on every request.
    request = InferenceRequest(model_name, {}, model_version)
    # Optional fields absent from most requests are not handed to their decoders at all.
    if "id" in doc:
        request.id = _request_id(doc)
    options = HttpOutputOptions()
    if "parameters" in doc:
        _apply_parameters(request, options, doc["parameters"])
    reader = BinaryReader(view, json_end, header_length is not None, model_name)
    planned = plan_inputs(doc, reader, request, max_input_size, model, shared_memory)
    reader.finish()
    if "outputs" in doc:
        request.requested_outputs = _decode_outputs(doc, options, shared_memory)
    request_id = request.id or "<id_unknown>"
    inputs = request.inputs
    for plan in planned:
        inputs[plan[0]] = decode_input(plan, model_name, request_id)
    request.frontend_state = options
    request.checked_for = model  # every input passed check_input for it (see plan_inputs)
    return request


def decode_raw_binary_request(
    body: Body,
    spec: TensorSpec,
    batched: bool,
    model_name: str,
    model_version: int | None,
    *,
    max_input_size: int = DEFAULT_MAX_INPUT_SIZE,
) -> InferenceRequest:
    """Decode a body sent with Inference-Header-Content-Length: 0: all of it is the data
    of the model's only input (the caller checks the model has exactly one)."""
    if len(body) > max_input_size:
        raise invalid(
            f"Raw input has a byte_size ({len(body)} bytes) that exceeds the maximum allowed "
            f"value of {max_input_size} bytes. Use --http-max-input-size to increase the limit."
        )
    shape = _raw_shape(spec, batched, len(body))
    label = InputLabel(spec.name, model_name, "<id_unknown>")
    if spec.datatype is DataType.BYTES:
        # The body is the one element, without a length prefix.
        data = bytes_array([bytes(body)]).reshape(shape)
        tensor = Tensor(spec.name, spec.datatype, shape, data)
    else:
        tensor = tensor_from_binary(label, spec.datatype, shape, math.prod(shape), body)
    request = InferenceRequest(
        model_name=model_name, inputs={spec.name: tensor}, model_version=model_version
    )
    request.frontend_state = HttpOutputOptions(binary_data_output=True)
    return request


def parse_json_object(data: Body, progress: Callable[[Any], None] | None = None
                      ) -> dict[str, Any]:
    """Parse a JSON document that must be an object; INVALID_ARG otherwise. A big one is
    parsed in pieces, so that on a worker thread it lets the event loop run in between
    (``progress``: see ``json_pieces.loads``)."""
    try:
        doc = (json_pieces.loads(data, progress=progress) if len(data) > json_pieces.PIECE
               else orjson.loads(data))
    except (orjson.JSONDecodeError, json_pieces.JsonError) as exc:
        raise invalid(f"failed to parse the request JSON buffer: {exc}") from None
    if type(doc) is not dict:
        raise invalid("failed to parse the request JSON buffer: the document is not an object")
    return doc


def _json_header_end(body_length: int, header_length: int | None, limit: int) -> int:
    if header_length is None:
        end = body_length
    elif 0 < header_length <= body_length:
        end = header_length
    elif header_length == 0:
        # The handler must route these to decode_raw_binary_request: it needs the model.
        raise invalid("a raw binary request (inference header size 0) needs the model's input")
    else:
        raise invalid(
            f"inference header size should be in range (0, {body_length}), got: {header_length}"
        )
    if end > limit:
        raise invalid(
            f"request JSON size of {end} bytes exceeds the maximum allowed input size of "
            f"{limit} bytes. Use --http-max-input-size to increase the limit."
        )
    return end


def _raw_shape(spec: TensorSpec, batched: bool, byte_size: int) -> tuple[int, ...]:
    shape = ([1] if batched else []) + list(spec.dims)
    wildcards = [axis for axis, dim in enumerate(shape) if dim == -1]
    if len(wildcards) > 1:
        raise invalid(
            f"The shape of the raw input '{spec.name}' can not be deduced because there are "
            "more than one variable-sized dimension"
        )
    fixed = math.prod(dim for dim in shape if dim != -1)
    if spec.datatype is DataType.BYTES:
        if wildcards or fixed != 1:
            raise invalid(
                f"For BYTE datatype raw input '{spec.name}', the model must have input shape [1]"
            )
    elif wildcards:
        unit = fixed * spec.datatype.itemsize
        shape[wildcards[0]] = byte_size // unit if unit else 0
    return tuple(shape)


def _request_id(doc: dict[str, Any]) -> str:
    value = doc.get("id", "")
    if type(value) is not str:
        raise invalid(messages.JSON_NOT_STRING.format(key="id"))
    return value


# ------------------------------------------------------------------ request parameters


_SCALAR_TYPES = frozenset((str, int, float, bool))
_only_scalars = _SCALAR_TYPES.issuperset
_OUTPUT_NAMES = ValueNames(unsigned=messages.JSON_SET_NOT_UNSIGNED)
_RESERVED_PARAMETERS = frozenset(("headers",))


def _apply_parameters(request: InferenceRequest, options: HttpOutputOptions, params: Any) -> None:
    if params is None:
        return
    if type(params) is not dict:
        raise invalid(messages.JSON_PARAMETERS_NOT_OBJECT)
    for key, value in params.items():
        if key == "binary_data_output":
            options.binary_data_output = parse_bool(key, value)
        elif not apply_known_parameter(request, key, value):
            request.parameters[key] = checked_parameter(key, value)


def checked_parameter(key: str, value: Any) -> ParamValue:
    """A request parameter the model may read; reserved keys and non-scalars are refused."""
    refuse_reserved(key, _RESERVED_PARAMETERS)
    return scalar_parameter(key, value)


def scalar_parameter(key: str, value: Any) -> ParamValue:
    """``value`` if JSON can hand it to a model as a parameter (no arrays, objects, null)."""
    if type(value) not in _SCALAR_TYPES:
        raise invalid(messages.JSON_PARAMETER_TYPE.format(key=key))
    return value


# --------------------------------------------------------------------------- outputs


def _decode_outputs(doc: dict[str, Any], options: HttpOutputOptions,
                    shared_memory: SharedMemoryRegistry | None) -> list[RequestedOutput] | None:
    """The ``outputs`` the request lists (the caller saw that it has the member)."""
    items = doc["outputs"]
    if type(items) is not list:
        raise invalid(messages.JSON_NOT_ARRAY.format(key="outputs"))
    if not items:  # asks for nothing in particular, which means every output
        return None
    outputs = [_decode_output(item, options, shared_memory) for item in items]
    listed = options.listed = {}
    for output in outputs:
        listed[output.name] = output.parameters
    return outputs


def _decode_output(item: Any, options: HttpOutputOptions,
                   shared_memory: SharedMemoryRegistry | None) -> RequestedOutput:
    if type(item) is not dict:
        raise invalid(messages.JSON_MISSING.format(key="name"))  # as Triton looks for it
    name = item.get("name")
    if type(name) is not str:
        raise field_error(item, "name", messages.JSON_NOT_STRING)
    params = item.get("parameters", {})
    if type(params) is not dict:
        raise invalid("Unable to parse 'parameters': expected a JSON object")
    if "shared_memory_region" in params:
        if options.shm_outputs is None:
            options.shm_outputs = {}
        options.shm_outputs[name] = shm.output_slice(params, shared_memory)
    if "binary_data" in params:
        parse_bool("binary_data", params["binary_data"])
    if "classification" in params:
        parse_unsigned("classification", params["classification"], _OUTPUT_NAMES)
    # Usually every parameter is a scalar, and the request's own dict is kept as it is.
    kept = params if _only_scalars(map(type, params.values())) else {
        key: value for key, value in params.items() if type(value) in _SCALAR_TYPES}
    return RequestedOutput(name, kept)


# -------------------------------------------------------------------------- response


def encode_infer_response(
    response: InferenceResponse, request: InferenceRequest
) -> tuple[list[tuple[str, str]], list[Part]]:
    """Response headers and body parts (JSON header first, then binary blobs in order).

    The model version and, for classification, ``batched`` (whether the first dimension is
    the batch) and ``labels`` (each output's class labels) come from ``response.served_by``.
    """
    header, spliced, blobs = _encode(response, request)
    if spliced is not None:
        return _assemble(header, spliced, blobs)
    if blobs:
        return [_BINARY_TYPE, (HEADER_LENGTH, str(len(header)))], [header, *blobs]
    return [_JSON_TYPE], [header]


def stream_infer_response(
    response: InferenceResponse, request: InferenceRequest
) -> tuple[list[tuple[str, str]], list[Part] | Iterator[Part]]:
    """As ``encode_infer_response``, except that when a big output goes as JSON the body is
    an iterator that makes its text as the body is sent, so that it is never all in memory.
    Not when binary outputs follow (their offset, the JSON's length, is needed up front),
    nor for BYTES (checked for UTF-8 only as they are written: too late for an error)."""
    header, spliced, blobs = _encode(response, request)
    if spliced is None or blobs or spliced.has_bytes:
        return _assemble(header, spliced, blobs)
    return [_JSON_TYPE], spliced.join(header)


def _assemble(header: bytes, spliced: _Spliced | None, blobs: list[Part]
              ) -> tuple[list[tuple[str, str]], list[Part]]:
    parts = [header] if spliced is None else list(spliced.join(header))
    if blobs:
        size = sum(map(len, parts))
        headers = [_BINARY_TYPE, (HEADER_LENGTH, str(size))]
    else:
        headers = [_JSON_TYPE]
    return headers, [*parts, *blobs]


def _encode(
    response: InferenceResponse, request: InferenceRequest
) -> tuple[bytes, _Spliced | None, list[Part]]:
    """The JSON header, the big JSON outputs to splice into it (None: none; made only
    when one is), and the binary blobs."""
    options = request.frontend_state
    if not isinstance(options, HttpOutputOptions):
        options = _JSON_OUTPUTS
    listed = options.listed
    if listed is None and request.requested_outputs is not None:  # not decoded here
        listed = _listed_outputs(request)
    served = response.served_by
    blobs: list[Part] = []
    spliced: _Spliced | None = None
    entries: list[dict[str, Any]] = []
    for tensor in response.outputs:
        classes: ParamValue = 0
        if listed is None:
            binary = options.binary_data_output
        else:
            params = listed.get(tensor.name)
            if params is None:
                continue
            binary = params.get("binary_data") is True
            classes = params.get("classification", 0)
        if options.shm_outputs is not None and tensor.name in options.shm_outputs:
            entries.append(_shared_memory_entry(tensor, options.shm_outputs[tensor.name]))
            continue
        if classes and type(classes) is int and classes > 0:  # most ask for no classes
            tensor = classify(tensor, classes, served is not None and served.batched,
                              None if served is None else served.labels)
        entry = _output_entry(tensor, binary, blobs)
        if entry is None:  # big JSON data: written apart, in slices
            if spliced is None:
                spliced = _Spliced()
            entry = _spliced_entry(tensor, spliced)
        entries.append(entry)
    return _dump_header(_response_header(response, request, entries)), spliced, blobs


def _listed_outputs(request: InferenceRequest) -> dict[str, dict[str, ParamValue]] | None:
    if request.requested_outputs is None:
        return None
    return {output.name: output.parameters for output in request.requested_outputs}


def _response_header(
    response: InferenceResponse, request: InferenceRequest, entries: list[dict[str, Any]]
) -> dict[str, Any]:
    served = response.served_by
    version = request.model_version if served is None else served.version
    header: dict[str, Any] = {}
    if request.id:
        header["id"] = request.id
    header["model_name"] = request.model_name if served is None else served.model_name
    header["model_version"] = "" if version is None else str(version)
    if response.parameters:
        header["parameters"] = response.parameters
    header["outputs"] = entries
    return header


def _dump_header(header: dict[str, Any]) -> bytes:
    try:
        # Numpy scalars are welcome among response parameters.
        return orjson.dumps(header, option=orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError as exc:
        raise TritiumError(
            ErrorCode.INTERNAL, f"failed to write the response JSON: {exc}"
        ) from None


class _Spliced:
    """Big outputs' JSON ``data``, written apart from the header in slices and put in
    place of a marker: no list of every element as Python objects, and no GIL held for
    longer than a slice takes."""

    __slots__ = ("_marker", "_tensors")

    def __init__(self) -> None:
        self._marker = ""
        self._tensors: list[Tensor] = []

    @property
    def has_bytes(self) -> bool:
        return any(tensor.datatype is DataType.BYTES for tensor in self._tensors)

    def add(self, tensor: Tensor) -> str:
        refuse_half_floats(tensor.datatype)
        if not self._marker:
            self._marker = "\x00tritium-data:" + secrets.token_hex(8)
        self._tensors.append(tensor)
        return self._marker

    def join(self, header: bytes) -> Iterator[Part]:
        """The header with each marker replaced by its tensor's data, piece by piece."""
        marker = orjson.dumps(self._marker)
        start = 0
        for tensor in self._tensors:
            at = header.index(marker, start)
            yield header[start:at]
            yield from json_pieces_of(tensor)
            start = at + len(marker)
        yield header[start:]


def _output_entry(tensor: Tensor, binary: bool, blobs: list[Part]) -> dict[str, Any] | None:
    """The output's entry in the JSON header (its binary data added to ``blobs``); None
    for JSON data too big to write inline (see ``_spliced_entry``)."""
    count = tensor.element_count
    if tensor.data.size != count:
        raise _output_size_error(tensor)
    if binary:
        blob = tensor_bytes(tensor)
        if len(blob):
            blobs.append(blob)
        return {"name": tensor.name, "datatype": tensor.datatype.wire,
                "shape": list(tensor.shape), "parameters": {"binary_data_size": len(blob)}}
    if count > SLICE:
        return None
    return {"name": tensor.name, "datatype": tensor.datatype.wire, "shape": list(tensor.shape),
            "data": json_values(tensor)}


def _shared_memory_entry(tensor: Tensor, region: Slice) -> dict[str, Any]:
    """The output written into its region; its entry has no data, as in Triton."""
    if tensor.data.size != tensor.element_count:
        raise _output_size_error(tensor)
    region.write_output(tensor.name, tensor_bytes(tensor))
    return {"name": tensor.name, "datatype": tensor.datatype.wire, "shape": list(tensor.shape)}


def _spliced_entry(tensor: Tensor, spliced: _Spliced) -> dict[str, Any]:
    return {"name": tensor.name, "datatype": tensor.datatype.wire, "shape": list(tensor.shape),
            "data": spliced.add(tensor)}


def _output_size_error(tensor: Tensor) -> TritiumError:
    return TritiumError(
        ErrorCode.INTERNAL,
        f"output tensor shape does not match size of output for '{tensor.name}'",
    )


# ---------------------------------------------------------------------------- errors


def encode_error(error: TritiumError) -> bytes:
    """The body of an HTTP error response."""
    return orjson.dumps({"error": error.message})
