"""Tensor element data in HTTP wire forms: JSON values, Triton's binary layout, class strings."""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tritium.core.errors import ErrorCode, TritiumError, invalid
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


# ---------------------------------------------------------------------------- binary

_LENGTH = struct.Struct("<I")


def split_length_prefixed(data: bytes, count: int, label: InputLabel) -> list[bytes]:
    """Split Triton's BYTES serialization (4-byte LE length, then the bytes) into elements."""
    elements: list[bytes] = []
    offset, end = 0, len(data)
    unpack = _LENGTH.unpack_from
    where = f"for inference input '{label.name}' for model '{label.model}'"
    while offset < end:
        if end - offset < 4:
            raise invalid(
                f"{label.prefix}incomplete string length indicator {where}, expecting 4 bytes "
                f"but only {end - offset} bytes available"
            )
        (size,) = unpack(data, offset)
        offset += 4
        if offset + size > end:
            raise invalid(
                f"{label.prefix}incomplete string data {where}, expecting {size} bytes but "
                f"only {end - offset} bytes available"
            )
        elements.append(data[offset : offset + size])
        offset += size
    if len(elements) != count:
        raise invalid(
            f"{label.prefix}expected {count} string elements {where}, got {len(elements)}"
        )
    return elements


def bytes_array(elements: Sequence[bytes]) -> np.ndarray:
    """A 1-D object array holding ``elements`` (numpy would otherwise make an 'S' array)."""
    array = np.empty(len(elements), dtype=object)
    array[:] = elements
    return array


def tensor_bytes(tensor: Tensor) -> Part:
    """The tensor in the binary layout: raw little-endian values, or length-prefixed BYTES."""
    if tensor.datatype is DataType.BYTES:
        return serialize_bytes(tensor.data)
    array = _typed(tensor)
    # A flat uint8 view: len() is the byte count and nothing is copied.
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data


def serialize_bytes(data: np.ndarray) -> bytes:
    """Triton's BYTES serialization of every element, row-major."""
    pack = _LENGTH.pack
    parts: list[bytes] = []
    for element in _as_bytes(data):
        parts.append(pack(len(element)))
        parts.append(element)
    return b"".join(parts)


def _as_bytes(data: np.ndarray) -> Iterable[bytes]:
    for element in data.reshape(-1).tolist():
        if type(element) is bytes:
            yield element
        elif isinstance(element, str):
            yield element.encode("utf-8")
        elif isinstance(element, bytes | bytearray | memoryview):
            yield bytes(element)
        else:
            yield str(element).encode("utf-8")


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


def array_from_json(flat: list[Any], datatype: DataType, name: str) -> np.ndarray:
    """A 1-D array of ``datatype`` from JSON scalars, refusing values of the wrong JSON type."""
    allowed = _JSON_ELEMENT_TYPES.get(datatype)
    if allowed is None:
        raise invalid(
            f"receiving {datatype.wire} data via JSON is not supported. Please use the binary "
            f"data format for input {name}"
        )
    found = set(map(type, flat))
    if not found <= allowed:
        bad = sorted(t.__name__ for t in found - allowed)
        raise invalid(
            f"Unable to parse 'data': input '{name}' of datatype {datatype.wire} cannot hold "
            f"JSON values of type {', '.join(bad)}"
        )
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
        return [_text(tensor.name, element) for element in _as_bytes(tensor.data)]
    if tensor.datatype is DataType.FP16 or tensor.datatype is DataType.BF16:
        raise invalid(
            f"sending {tensor.datatype.wire} data via JSON is not supported. Please use the "
            "binary data format for output"
        )
    return _typed(tensor).reshape(-1).tolist()


def _text(name: str, element: bytes) -> str:
    try:
        return element.decode("utf-8")
    except UnicodeDecodeError:
        raise TritiumError(
            ErrorCode.INTERNAL,
            f"output '{name}' holds bytes that are not valid UTF-8, so it cannot be sent as "
            "JSON; request it with binary_data set to true",
        ) from None


def _typed(tensor: Tensor) -> np.ndarray:
    array = tensor.data
    wanted = tensor.datatype.numpy
    if array.dtype == wanted:
        return array
    if tensor.datatype is DataType.BF16 and array.dtype.itemsize == 2:
        return np.ascontiguousarray(array).view(np.uint16)  # bfloat16 bit patterns
    try:
        return array.astype(wanted)
    except (TypeError, ValueError) as exc:
        raise TritiumError(
            ErrorCode.INTERNAL,
            f"output '{tensor.name}' holds {array.dtype} values that cannot be sent as "
            f"{tensor.datatype.wire}: {exc}",
        ) from None


# -------------------------------------------------------------------- classification

_CLASSIFIABLE = frozenset(t for t in DataType if t.numpy.kind in "iuf") - {
    DataType.FP16,
    DataType.BF16,
}


def classify(
    tensor: Tensor, count: int, batched: bool, labels: Mapping[str, Sequence[str]] | None
) -> Tensor:
    """The top ``count`` classes of each batch entry as BYTES "<value>:<index>[:<label>]"."""
    if tensor.datatype not in _CLASSIFIABLE:
        raise invalid(
            "class result not available for output due to unsupported type "
            f"'{tensor.datatype.wire}'"
        )
    shape = tensor.shape
    rows = shape[0] if batched and shape else 1
    per_row = math.prod(shape[1:]) if batched and shape else math.prod(shape)
    values = _typed(tensor).reshape(rows, per_row)
    names = labels.get(tensor.name) if labels else None
    fmt = "%f" if values.dtype.kind == "f" else "%d"
    top = min(count, per_row)
    classes: list[bytes] = []
    for row in values:
        for index in np.argsort(-row.astype(np.float64), kind="stable")[:top].tolist():
            text = (fmt % row[index]) + f":{index}"
            if names is not None and index < len(names):
                text += f":{names[index]}"
            classes.append(text.encode("utf-8"))
    out_shape = (rows, top) if batched and shape else (top,)
    return Tensor(tensor.name, DataType.BYTES, out_shape, bytes_array(classes).reshape(out_shape))
