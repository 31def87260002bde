"""An /infer body's inputs: each checked against the model first, its data decoded after."""

from __future__ import annotations

import enum
import math
from collections.abc import Sized
from typing import Any

import numpy as np

from tritium.core import messages
from tritium.core.errors import TritiumError, invalid
from tritium.core.model import ModelHandle
from tritium.core.request import InferenceRequest
from tritium.core.serialization import array_from_binary
from tritium.core.shared_memory import SharedMemoryRegistry
from tritium.core.types import BYTES, DataType, Tensor
from tritium.core.validation import check_input, element_count
from tritium.frontends.http import shared_memory as shm
from tritium.frontends.http.tensor_data import InputLabel, array_from_json, flatten_json

_from_wire = DataType.from_wire

HEADER_LENGTH = "Inference-Header-Content-Length"

Body = bytes | bytearray | memoryview


class _Source(enum.Enum):
    """Where an input's values travel."""

    JSON = "data"
    BINARY = "binary_data_size"
    SHARED_MEMORY = "shared_memory_region"


class BinaryReader:
    """Hands out the binary section of the body, input by input, without copying."""

    __slots__ = ("_header_given", "_model", "_offset", "_view")

    def __init__(self, view: memoryview, offset: int, header_given: bool, model: str):
        self._view = view
        self._offset = offset
        self._header_given = header_given
        self._model = model

    def take(self, name: str, size: int) -> memoryview:
        if size == 0:
            return self._view[:0]
        if not self._header_given:
            raise invalid(
                f"must specify valid '{HEADER_LENGTH}' in request header and "
                "'binary_data_size' when passing inputs in binary data format"
            )
        end = self._offset + size
        if end > len(self._view):
            raise invalid(
                f"unexpected size for input '{name}', expecting {end - len(self._view)} "
                f"additional bytes for model '{self._model}'"
            )
        chunk = self._view[self._offset : end]
        self._offset = end
        return chunk

    def finish(self) -> None:
        if self._offset != len(self._view):
            raise invalid(f"unexpected additional input data for model '{self._model}'")


# An input whose description passed every check, its data not decoded yet: name, datatype,
# shape, element count, and either its binary chunk or (chunk None) its JSON ``data``. A
# plain tuple: one is made per input of every request.
PlannedInput = tuple[str, DataType, tuple[int, ...], int, "Body | None", Any]


def plan_inputs(
    doc: dict[str, Any],
    reader: BinaryReader,
    request: InferenceRequest,
    limit: int,
    model: ModelHandle | None,
    shared_memory: SharedMemoryRegistry | None = None,
) -> list[PlannedInput]:
    """Every input checked (against ``model`` too, when given), none of their data decoded."""
    items = doc.get("inputs")
    if type(items) is not list:
        raise field_error(doc, "inputs", messages.JSON_NOT_ARRAY)
    request_id = request.id or "<id_unknown>"
    if len(items) == 1:  # the usual request: no other input its name could clash with
        return [_plan_input(items[0], reader, request_id, request.model_name, limit, model,
                            shared_memory)]
    planned: dict[str, PlannedInput] = {}
    for item in items:
        plan = _plan_input(item, reader, request_id, request.model_name, limit, model,
                           shared_memory)
        if plan[0] in planned:
            raise invalid(
                f"[request id: {request_id}] input '{plan[0]}' already exists in request"
            )
        planned[plan[0]] = plan
    return list(planned.values())


def _plan_input(
    item: Any,
    reader: BinaryReader,
    request_id: str,
    model_name: str,
    limit: int,
    model: ModelHandle | None,
    shared_memory: SharedMemoryRegistry | None = None,
) -> PlannedInput:
    if type(item) is not dict:  # Triton finds none of the data fields in it
        raise _source_error({}, {})
    params = item.get("parameters", _NO_PARAMETERS)
    if type(params) is not dict:
        raise invalid("Unable to parse 'parameters': expected a JSON object")
    binary = "binary_data_size" in params
    if binary + ("data" in item) + ("shared_memory_region" in params) != 1:
        raise _source_error(item, params)
    name = item.get("name")
    if type(name) is not str:
        raise field_error(item, "name", messages.JSON_NOT_STRING)
    wire = item.get("datatype")
    datatype = _from_wire(wire) if type(wire) is str else None
    if datatype is None:
        if type(wire) is not str:
            raise field_error(item, "datatype", messages.JSON_NOT_STRING)
        raise invalid(messages.JSON_INVALID_DATATYPE.format(name=name))
    shape = _shape(item.get("shape", _MISSING))
    count = element_count(name, shape, request_id)
    if model is not None:
        check_input(model, name, datatype, shape, request_id)
    if binary or "data" not in item:
        if binary:
            size = params["binary_data_size"]
            if type(size) is not int or size < 0:
                raise invalid(messages.JSON_NOT_UNSIGNED.format(key="binary_data_size"))
            chunk: Body = reader.take(name, size)
        else:
            chunk = _shared_memory_chunk(params, shared_memory, datatype, count,
                                         InputLabel(name, model_name, request_id))
        # The size is compared first: it is what the usual input is refused or passed on.
        if len(chunk) != count * datatype.itemsize and datatype is not BYTES:
            raise _binary_size_error(InputLabel(name, model_name, request_id), datatype, count,
                                     chunk)
        return (name, datatype, shape, count, chunk, None)
    data = item["data"]
    _check_json_size(name, datatype, count, data, limit)
    return (name, datatype, shape, count, None, data)


def decode_input(plan: PlannedInput, model_name: str, request_id: str) -> Tensor:
    """The tensor of an input ``plan_inputs`` checked (sizes included)."""
    name, datatype, shape, count, chunk, data = plan
    if chunk is not None:
        if datatype is BYTES:
            array = array_from_binary(chunk, datatype, count,
                                      f"for inference input '{name}' for model '{model_name}'",
                                      f"[request id: {request_id}] ")
        else:  # zero-copy: the array is a view of the request body
            array = np.frombuffer(chunk, dtype=datatype.numpy)
        return Tensor(name, datatype, shape, array.reshape(shape))
    # Clients send flat data; nested data (rows first) is rare, so one probe decides.
    flat = flatten_json(data) if data and type(data[0]) is list else data
    if len(flat) != count:
        raise _json_count_error()
    return Tensor(name, datatype, shape, array_from_json(flat, datatype, name).reshape(shape))


_NO_PARAMETERS: dict[str, Any] = {}
_MISSING = object()


def field_error(doc: dict[str, Any], key: str, wrong_type: str) -> TritiumError:
    """TritonJson's refusal of a member: absent, or of the wrong type (``wrong_type``)."""
    template = wrong_type if key in doc else messages.JSON_MISSING
    return invalid(template.format(key=key))
_SOURCES = (_Source.JSON, _Source.BINARY, _Source.SHARED_MEMORY)


def _source_error(item: dict[str, Any], params: dict[str, Any]) -> TritiumError:
    found = ("data" in item, "binary_data_size" in params, "shared_memory_region" in params)
    pairs = zip(_SOURCES, found, strict=True)
    named = [f"'{source.value}'" for source, present in pairs if present]
    detail = " set " + " ".join(named) if named else " no field is set"
    return invalid(
        "Input must set only one of the following fields: 'data', 'binary_data_size' in "
        f"'parameters', 'shared_memory_region' in 'parameters'. But{detail}"
    )


# Checks of every dimension at once, in C: no Python loop per dimension of every input.
_only_ints = frozenset((int,)).issuperset


def _shape(value: Any) -> tuple[int, ...]:
    if type(value) is list:
        if _only_ints(map(type, value)) and min(value, default=0) >= 0:
            return tuple(value)
        raise invalid(messages.JSON_NOT_UNSIGNED.format(key="shape"))
    if value is _MISSING:
        raise invalid(messages.JSON_MISSING.format(key="shape"))
    raise invalid(messages.JSON_NOT_ARRAY.format(key="shape"))


def _check_binary_size(label: InputLabel, datatype: DataType, count: int, chunk: Body) -> None:
    if datatype is not BYTES and len(chunk) != count * datatype.itemsize:
        raise _binary_size_error(label, datatype, count, chunk)


def _shared_memory_chunk(params: dict[str, Any], shared_memory: SharedMemoryRegistry | None,
                         datatype: DataType, count: int, label: InputLabel) -> memoryview:
    """The input's bytes, copied out of the client's region (which may change, or shrink,
    under us), its size checked before anything is read."""
    region = shm.input_slice(params, shared_memory)
    if datatype is not BYTES and len(region) != count * datatype.itemsize:
        raise _binary_size_error(label, datatype, count, region)
    return region.read()


def _binary_size_error(label: InputLabel, datatype: DataType, count: int, chunk: Sized
                       ) -> TritiumError:
    return invalid(
        f"{label.prefix}input byte size mismatch for input '{label.name}' for model "
        f"'{label.model}'. Expected {count * datatype.itemsize}, got {len(chunk)}"
    )


def tensor_from_binary(
    label: InputLabel, datatype: DataType, shape: tuple[int, ...], count: int, chunk: Body
) -> Tensor:
    _check_binary_size(label, datatype, count, chunk)
    # Zero-copy for fixed-size types: the array is a view of the request body.
    data = array_from_binary(chunk, datatype, count, label.where, label.prefix)
    return Tensor(label.name, datatype, shape, data.reshape(shape))


def _check_json_size(name: str, datatype: DataType, count: int, data: Any, limit: int) -> None:
    if type(data) is not list:
        raise invalid(messages.JSON_NOT_ARRAY.format(key="data"))
    if not (data and type(data[0]) is list) and len(data) != count:
        raise _json_count_error()
    byte_size = count * datatype.numpy.itemsize
    if byte_size > limit:
        raise invalid(
            f"JSON input '{name}' has a byte_size ({byte_size} bytes) that exceeds the "
            f"maximum allowed value of {limit} bytes. Use --http-max-input-size to increase "
            "the limit."
        )


def refuse_overflowing_data(doc: Any) -> None:
    """While a big body is still being parsed: refuse it as soon as the input whose data is
    arriving holds more flat elements than its shape (given before it) has room for, rather
    than once all of it is built (hundreds of MiB of Python numbers for a 60 MiB body)."""
    inputs = doc.get("inputs") if type(doc) is dict else None
    # Only the last input can be growing: the others are whole and checked as usual.
    item = inputs[-1] if type(inputs) is list and inputs else None
    if type(item) is not dict:
        return
    data, shape = item.get("data"), item.get("shape")
    if type(data) is not list or not data or type(data[0]) is list or type(shape) is not list:
        return
    if all(type(dim) is int and dim >= 0 for dim in shape) and len(data) > math.prod(shape):
        raise _json_count_error()


def _json_count_error() -> TritiumError:
    return invalid("Unable to parse 'data': Shape does not match true shape of 'data' field")
