"""Triton's binary tensor layout: LE row-major values; BYTES as 4-byte LE length + bytes each."""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence

import numpy as np

from tritium.core.errors import ErrorCode, TritiumError, invalid
from tritium.core.types import DataType, Tensor

Buffer = bytes | bytearray | memoryview

_LENGTH = struct.Struct("<I")


def split_length_prefixed(data: bytes, count: int, what: str, prefix: str = "") -> list[bytes]:
    """Split BYTES serialization into ``count`` elements.

    Error messages read "{prefix}<problem> {what}, ...": the caller names where the data came
    from (for example "for input 'x'") and may put a request id in ``prefix``.
    """
    elements: list[bytes] = []
    offset, end = 0, len(data)
    unpack = _LENGTH.unpack_from
    while offset < end:
        if end - offset < 4:
            raise invalid(
                f"{prefix}incomplete string length indicator {what}, expecting 4 bytes "
                f"but only {end - offset} bytes available"
            )
        (size,) = unpack(data, offset)
        offset += 4
        if offset + size > end:
            raise invalid(
                f"{prefix}incomplete string data {what}, expecting {size} bytes but "
                f"only {end - offset} bytes available"
            )
        elements.append(data[offset : offset + size])
        offset += size
    if len(elements) != count:
        raise invalid(f"{prefix}expected {count} string elements {what}, got {len(elements)}")
    return elements


def array_from_binary(
    data: Buffer, datatype: DataType, count: int, what: str, prefix: str = ""
) -> np.ndarray:
    """A 1-D array of ``count`` elements; fixed-size values are a view of ``data``, not a copy.

    The caller has checked a fixed-size type's byte count (each frontend words that error
    its own way); BYTES are checked here, ``what`` and ``prefix`` as for split_length_prefixed.
    """
    if datatype is DataType.BYTES:
        return bytes_array(split_length_prefixed(bytes(data), count, what, prefix))
    return np.frombuffer(data, dtype=datatype.numpy)


def bytes_array(elements: Sequence[bytes]) -> np.ndarray:
    """A 1-D object array holding ``elements`` (numpy would otherwise make an 'S' array)."""
    array = np.empty(len(elements), dtype=object)
    array[:] = elements
    return array


def tensor_bytes(tensor: Tensor) -> bytes | memoryview:
    """The tensor in the binary layout: raw little-endian values, or length-prefixed BYTES."""
    if tensor.datatype is DataType.BYTES:
        return serialize_bytes(tensor.data)
    array = wire_array(tensor)
    # A flat uint8 view: len() is the byte count and nothing is copied.
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data


def serialize_bytes(data: np.ndarray) -> bytes:
    """BYTES serialization of every element, row-major."""
    pack = _LENGTH.pack
    parts: list[bytes] = []
    for element in bytes_elements(data):
        parts.append(pack(len(element)))
        parts.append(element)
    return b"".join(parts)


def bytes_elements(data: np.ndarray) -> Iterator[bytes]:
    """Each element row-major as bytes: str as UTF-8, anything else as its str() in UTF-8."""
    for element in data.reshape(-1).tolist():
        if type(element) is bytes:
            yield element
        elif isinstance(element, str):
            yield element.encode("utf-8")
        elif isinstance(element, bytes | bytearray | memoryview):
            yield bytes(element)
        else:
            yield str(element).encode("utf-8")


def wire_array(tensor: Tensor) -> np.ndarray:
    """The tensor's values in its datatype's numpy dtype (BF16 as uint16 bit patterns)."""
    array = tensor.data
    wanted = tensor.datatype.numpy
    if array.dtype == wanted:
        return array
    if tensor.datatype is DataType.BF16 and array.dtype.itemsize == 2:
        return np.ascontiguousarray(array).view(np.uint16)
    try:
        return array.astype(wanted)
    except (TypeError, ValueError) as exc:
        raise TritiumError(
            ErrorCode.INTERNAL,
            f"output '{tensor.name}' holds {array.dtype} values that cannot be sent as "
            f"{tensor.datatype.wire}: {exc}",
        ) from None
