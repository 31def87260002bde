"""Triton's binary tensor layout: LE row-major values; BYTES as 4-byte LE length + bytes each."""

from __future__ import annotations

import struct
from collections.abc import Generator, Iterator, Sequence
from typing import Any

import numpy as np

from tritium.core.errors import ErrorCode, TritiumError, invalid
from tritium.core.types import BYTES, DataType, Tensor

Buffer = bytes | bytearray | memoryview

_LENGTH = struct.Struct("<I")


# Work on at most this many elements per numpy call, so that a thread decoding a big tensor
# off the event loop holds the GIL for a few milliseconds at a time.
SLICE = 1 << 16
_SCALAR_STEPS = 64  # elements walked one by one after a short run, before trying runs again


def split_length_prefixed(data: Buffer, count: int, what: str, prefix: str = "") -> list[bytes]:
    """Split BYTES serialization into ``count`` elements.

    Error messages read "{prefix}<problem> {what}, ...": the caller names where the data came
    from (for example "for input 'x'") and may put a request id in ``prefix``.
    """
    return bytes_from_binary(data, count, what, prefix).tolist()


def bytes_from_binary(data: Buffer, count: int, what: str, prefix: str = "") -> np.ndarray:
    """A 1-D object array of the ``count`` elements of a BYTES serialization."""
    raw = data if isinstance(data, bytes) else memoryview(data).cast("B")
    # Each element takes at least its 4-byte length: a count beyond that cannot be right,
    # and the array for it is never allocated.
    out = np.empty(count, dtype=object) if count <= len(raw) // 4 else None
    found = 0
    runs = _runs(raw, what, prefix)
    for run, elements in runs:
        if out is not None and found + run <= count:
            out[found : found + run] = elements
        found += run
        if found > count:
            break
    if found != count or out is None:
        # Past the count, the rest is not walked: a hostile tail costs nothing.
        more = "" if next(runs, None) is None else "at least "
        raise invalid(f"{prefix}expected {count} string elements {what}, got {more}{found}")
    return out


def _runs(raw: Buffer, what: str, prefix: str) -> Iterator[tuple[int, Any]]:
    """``(n, elements)`` for the next ``n`` elements, in order. Runs of equal sizes
    (fixed-width strings, or a flood of empty ones) are found with one numpy comparison;
    mixed sizes are walked one by one, a batch at a time."""
    offset, end = 0, len(raw)
    width = 16
    while offset < end:
        size = _length_at(raw, offset, end, what, prefix)
        stride = 4 + size
        fits = min(width, (end - offset) // stride)
        if fits < 2:
            width = 16
            offset = yield from _walk(raw, offset, end, what, prefix)
            continue
        lengths = np.ndarray((fits,), "<u4", raw, offset, (stride,))
        differ = np.flatnonzero(lengths != size)
        run = int(differ[0]) if differ.size else fits
        if run < 4:
            width = 16
            offset = yield from _walk(raw, offset, end, what, prefix)
            continue
        yield run, _same_size(raw, offset, size, run)
        offset += run * stride
        if run == width:
            width = min(width * 2, SLICE)


def _walk(raw: Buffer, offset: int, end: int, what: str, prefix: str
          ) -> Generator[tuple[int, Any], None, int]:
    """Up to _SCALAR_STEPS elements, one by one; returns where it stopped."""
    elements = []
    unpack = _LENGTH.unpack_from
    for _ in range(_SCALAR_STEPS):
        if offset >= end:
            break
        if end - offset < 4:
            raise _short_length(offset, end, what, prefix)
        (size,) = unpack(raw, offset)
        offset += 4
        if offset + size > end:
            raise invalid(
                f"{prefix}incomplete string data {what}, expecting {size} bytes but "
                f"only {end - offset} bytes available"
            )
        elements.append(bytes(raw[offset : offset + size]))
        offset += size
    yield len(elements), elements
    return offset


def _length_at(raw: Buffer, offset: int, end: int, what: str, prefix: str) -> int:
    if end - offset < 4:
        raise _short_length(offset, end, what, prefix)
    size: int = _LENGTH.unpack_from(raw, offset)[0]
    return size


def _short_length(offset: int, end: int, what: str, prefix: str) -> TritiumError:
    return invalid(
        f"{prefix}incomplete string length indicator {what}, expecting 4 bytes "
        f"but only {end - offset} bytes available"
    )


def _same_size(raw: Buffer, offset: int, size: int, run: int) -> Any:
    if size == 0:
        return b""
    # Void items come out as bytes objects, trailing NULs kept (an 'S' dtype would drop them).
    return np.ndarray((run,), f"V{size}", raw, offset + 4, (4 + size,)).tolist()


def array_from_binary(
    data: Buffer, datatype: DataType, count: int, what: str, prefix: str = ""
) -> np.ndarray:
    """A 1-D array of ``count`` elements; fixed-size values are a view of ``data``, not a copy.

    The caller has checked a fixed-size type's byte count (each frontend words that error
    its own way); BYTES are checked here, ``what`` and ``prefix`` as for split_length_prefixed.
    """
    if datatype is BYTES:
        return bytes_from_binary(data, count, what, prefix)
    return np.frombuffer(data, dtype=datatype.numpy)


def bytes_array(elements: Sequence[bytes]) -> np.ndarray:
    """A 1-D object array holding ``elements`` (numpy would otherwise make an 'S' array)."""
    array = np.empty(len(elements), dtype=object)
    for start in range(0, len(elements), SLICE):
        array[start : start + SLICE] = elements[start : start + SLICE]
    return array


def tensor_bytes(tensor: Tensor) -> bytes | memoryview:
    """The tensor in the binary layout: raw little-endian values, or length-prefixed BYTES."""
    datatype = tensor.datatype
    if datatype is BYTES:
        return serialize_bytes(tensor.data)
    array = tensor.data
    if array.dtype != datatype.numpy:  # the usual array is already right: no call for it
        array = wire_array(tensor)
    # A flat uint8 view: len() is the byte count and nothing is copied (``ravel`` copies
    # only an array that is not C-contiguous, which a view needs).
    return array.ravel().view(np.uint8).data


def serialize_bytes(data: np.ndarray) -> bytes:
    """BYTES serialization of every element, row-major, a slice at a time (no one C call
    over the whole tensor: see ``core.offload``)."""
    flat = data.reshape(-1)
    chunks = [_serialize_slice(_as_bytes(flat[start : start + SLICE].tolist()))
              for start in range(0, flat.size, SLICE)]
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _serialize_slice(elements: list[bytes]) -> bytes:
    sizes = set(map(len, elements))
    if len(elements) > 16 and len(sizes) == 1:
        # All one size (fixed-width strings, or all empty): laid out by numpy at once.
        (size,) = sizes
        rows = np.empty((len(elements), 4 + size), dtype=np.uint8)
        rows[:, :4] = np.frombuffer(_LENGTH.pack(size), dtype=np.uint8)
        if size:
            rows[:, 4:] = np.frombuffer(b"".join(elements), dtype=np.uint8).reshape(-1, size)
        return rows.tobytes()
    pack = _LENGTH.pack
    parts: list[bytes] = []
    for element in elements:
        parts.append(pack(len(element)))
        parts.append(element)
    return b"".join(parts)


def bytes_elements(data: np.ndarray) -> Iterator[bytes]:
    """Each element row-major as bytes: str as UTF-8, anything else as its str() in UTF-8."""
    flat = data.reshape(-1)
    for start in range(0, flat.size, SLICE):
        yield from _as_bytes(flat[start : start + SLICE].tolist())


def _as_bytes(elements: list[Any]) -> list[bytes]:
    if set(map(type, elements)) <= _JUST_BYTES:
        return elements
    return [_element_bytes(element) for element in elements]


_JUST_BYTES = frozenset((bytes,))


def _element_bytes(element: Any) -> bytes:
    if type(element) is bytes:
        return element
    if isinstance(element, str):
        return element.encode("utf-8")
    if isinstance(element, bytes | bytearray | memoryview):
        return bytes(element)
    return str(element).encode("utf-8")


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
