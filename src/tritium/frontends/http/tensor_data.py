"""Tensor element data in HTTP wire forms: JSON values (binary and classification: core)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from tritium.core.errors import ErrorCode, TritiumError, invalid
from tritium.core.serialization import SLICE, bytes_array, bytes_elements, wire_array
from tritium.core.types import DataType, Tensor

MAX_JSON_DEPTH = 100

Part = bytes | memoryview  # one piece of a response body; views avoid a copy


@dataclass(slots=True)
class InputLabel:
    """How error messages name an input."""

    name: str
    model: str
    request_id: str

    @property
    def prefix(self) -> str:
        return f"[request id: {self.request_id}] "

    @property
    def where(self) -> str:
        return f"for inference input '{self.name}' for model '{self.model}'"


# ------------------------------------------------------------------------------ JSON


def flatten_json(data: list[Any], depth: int = 1) -> list[Any]:
    """Row-major leaves of nested JSON arrays."""
    if depth >= MAX_JSON_DEPTH:
        raise invalid(f"JSON nesting depth exceeds maximum allowed limit ({MAX_JSON_DEPTH})")
    flat: list[Any] = []
    for value in data:
        if type(value) is list:
            flat.extend(flatten_json(value, depth + 1))
        else:
            flat.append(value)
    return flat


_INTEGER = frozenset((int,))
_NUMBER = frozenset((int, float))
# FP16 and BF16 are absent: JSON cannot carry them (BF16's uint16 storage is no integer).
_JSON_ELEMENT_TYPES: dict[DataType, frozenset[type]] = {
    DataType.BOOL: frozenset((bool,)),
    DataType.FP32: _NUMBER,
    DataType.FP64: _NUMBER,
    DataType.BYTES: frozenset((str,)),
    **{t: _INTEGER for t in DataType if t.numpy.kind in "iu" and t is not DataType.BF16},
}
# What Triton's JSON reader says when an element is not of the JSON type a datatype needs.
_NOT_BOOLEAN = "attempt to access JSON non-boolean as boolean"
_NOT_STRING = "attempt to access JSON non-string as string"
_NOT_NUMBER = "attempt to access JSON non-number as double"
_NOT_SIGNED = "attempt to access JSON non-signed-integer as signed-integer"
_NOT_UNSIGNED = "attempt to access JSON non-unsigned-integer as unsigned-integer"


def _wrong_type_text(datatype: DataType) -> str:
    if datatype is DataType.BOOL:
        return _NOT_BOOLEAN
    if datatype is DataType.BYTES:
        return _NOT_STRING
    if datatype.numpy.kind == "f":
        return _NOT_NUMBER
    return _NOT_UNSIGNED if datatype.numpy.kind == "u" else _NOT_SIGNED


def array_from_json(flat: list[Any], datatype: DataType, name: str) -> np.ndarray:
    """A 1-D array of ``datatype`` from JSON scalars, refusing values of the wrong JSON type.

    A long list is converted a slice at a time (see ``core.offload``), each by this function."""
    allowed = _JSON_ELEMENT_TYPES.get(datatype)
    if allowed is None:
        raise invalid(
            f"receiving {datatype.wire} data via JSON is not supported. Please use the binary "
            f"data format for input {name}"
        )
    if len(flat) > SLICE:
        out = np.empty(len(flat), dtype=datatype.numpy)
        for start in range(0, len(flat), SLICE):
            out[start : start + SLICE] = array_from_json(flat[start : start + SLICE], datatype,
                                                         name)
        return out
    found = set(map(type, flat))
    if not found <= allowed:
        # Triton's words; which JSON types were found is left to the log-free client.
        raise invalid(f"Unable to parse 'data': {_wrong_type_text(datatype)}")
    if datatype is DataType.BYTES:
        return bytes_array([text.encode("utf-8", "surrogatepass") for text in flat])
    try:
        # Floats out of FP32 range become inf, as a C cast would make them.
        with np.errstate(over="ignore"):
            return np.array(flat, dtype=datatype.numpy)
    except OverflowError:
        raise invalid(
            f"Unable to parse 'data': a value of input '{name}' is out of range for "
            f"{datatype.wire}"
        ) from None


def json_values(tensor: Tensor) -> list[Any]:
    """The tensor's elements as a flat JSON array (BYTES as UTF-8 text)."""
    if tensor.datatype is DataType.BYTES:
        return [_text(tensor.name, element) for element in bytes_elements(tensor.data)]
    if tensor.datatype is DataType.FP16 or tensor.datatype is DataType.BF16:
        refuse_half_floats(tensor.datatype)
    return wire_array(tensor).reshape(-1).tolist()


def refuse_half_floats(datatype: DataType) -> None:
    """JSON has no FP16 or BF16 form: INVALID_ARG for them."""
    if datatype is DataType.FP16 or datatype is DataType.BF16:
        raise invalid(
            f"sending {datatype.wire} data via JSON is not supported. Please use the "
            "binary data format for output"
        )


def json_pieces_of(tensor: Tensor) -> Iterator[Part]:
    """``orjson.dumps(json_values(tensor))`` in pieces of SLICE elements each, made as they
    are asked for: no one call holds the GIL long, and the whole tensor never exists as
    Python objects (nor, when the pieces are sent as they come, as JSON text)."""
    flat = tensor.data.reshape(-1)
    if tensor.datatype is not DataType.BYTES:
        refuse_half_floats(tensor.datatype)
        flat = wire_array(Tensor(tensor.name, tensor.datatype, (flat.size,), flat))
    yield b"["
    for start in range(0, flat.size, SLICE):
        part = flat[start : start + SLICE]
        values = json_values(Tensor(tensor.name, tensor.datatype, (part.size,), part))
        if start:
            yield b","
        yield memoryview(orjson.dumps(values))[1:-1]
    yield b"]"


def _text(name: str, element: bytes) -> str:
    try:
        return element.decode("utf-8")
    except UnicodeDecodeError:
        raise TritiumError(
            ErrorCode.INTERNAL,
            f"output '{name}' holds bytes that are not valid UTF-8, so it cannot be sent as "
            "JSON; request it with binary_data set to true",
        ) from None
