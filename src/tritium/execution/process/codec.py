"""The one codec for everything that crosses the process boundary.

A frame is a 4-byte little-endian length and a msgpack array ``[tag, *fields]`` naming one
of the message types of messages.py (msgspec structs). msgspec (C) encodes them and, when
decoding, checks every field against the struct's annotations while it builds it: a frame
is either one well-formed message or a ``FrameError``. msgpack carries only plain values
(None, bool, int, float, str, bytes, arrays, maps): nothing on the wire can name a type to
build or code to run, as a pickle can. Frames larger than ``MAX_FRAME`` are refused before
a byte of their body is buffered.
"""

from __future__ import annotations

import struct
from typing import Any, TypeVar, Union

import msgspec

from tritium.execution.process.messages import ON_THE_WIRE

LENGTH = struct.Struct("<I")
MAX_FRAME = 64 << 20  # metadata, and tensors inline when small or when no arena block fits

T = TypeVar("T")


class FrameError(Exception):
    """A frame that is not a well-formed message: its sender is broken or hostile."""


_encoder = msgspec.msgpack.Encoder()
_decoder: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(
    Union[ON_THE_WIRE])  # noqa: UP007
_plain = msgspec.msgpack.Decoder()
_decode = _decoder.decode
_HEAD = LENGTH.size


def encode(message: Any) -> bytearray:
    """One frame: the length, then ``[tag, *fields]``."""
    frame = bytearray()
    encode_onto(message, frame)
    return frame


def encode_onto(message: Any, out: bytearray) -> None:
    """Append ``message``'s frame to ``out`` (frames sent together are written in place)."""
    start = len(out)
    _encoder.encode_into(message, out, start + _HEAD)
    length = len(out) - start - _HEAD
    if length > MAX_FRAME:
        del out[start:]
        raise _too_large(message, length)
    LENGTH.pack_into(out, start, length)


def _too_large(message: Any, length: int) -> FrameError:
    return FrameError(f"a {type(message).__name__} frame of {length} bytes exceeds the "
                      f"limit of {MAX_FRAME}")


def decode(body: bytes | bytearray | memoryview) -> Any:
    """The message one frame's body holds; ``FrameError`` if it holds anything else."""
    try:
        # The frame's length was checked against MAX_FRAME before it was buffered.
        return _decode(body)
    except msgspec.MsgspecError as exc:
        raise _not_a_message(exc) from None


def decode_all(bodies: list[bytearray]) -> list[Any]:
    """The messages of several frame bodies, in order (``decode`` for each)."""
    try:
        return list(map(_decode, bodies))  # no Python frame per body
    except msgspec.MsgspecError as exc:
        raise _not_a_message(exc) from None


def _not_a_message(exc: Exception) -> FrameError:
    return FrameError(f"not a message: {exc}")


def pack_value(value: Any) -> bytes:
    """A plain value (structs as arrays), as ``unpack_value`` reads it."""
    return _encoder.encode(value)


def unpack_value(data: bytes | memoryview) -> Any:
    try:
        return _plain.decode(data)
    except msgspec.MsgspecError as exc:
        raise FrameError(f"undecodable value: {exc}") from None


def convert(tp: type[T], value: Any) -> T:
    """``value`` (plain, as decoded) checked against the type ``tp`` and built into it."""
    try:
        return msgspec.convert(value, tp)
    except msgspec.MsgspecError as exc:
        raise FrameError(f"bad {getattr(tp, '__name__', tp)}: {exc}") from None


# -- framing -------------------------------------------------------------------------


class FrameReader:
    """Cuts a byte stream into frame bodies, at most ``limit`` per call; keeps the rest.

    A length above ``MAX_FRAME`` raises ``FrameError`` at once: nothing of such a frame is
    buffered. Bodies are decoded by the caller, so that it can bound the work of one turn.
    """

    def __init__(self) -> None:
        self._pending = bytearray()
        self._at = 0  # where the next frame starts in _pending

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._at:
            del self._pending[:self._at]
            self._at = 0
        self._pending += data

    def messages(self, buffer: memoryview, count: int, limit: int) -> list[Any]:
        """The messages of the first ``count`` bytes of ``buffer``: ``feed`` them, then up
        to ``limit`` ``bodies``, decoded. A read that is exactly one frame (the usual one,
        one request at a time) is cut and decoded at once, without buffering it first."""
        if not self._pending and count > _HEAD:
            (length,) = LENGTH.unpack_from(buffer)
            if length + _HEAD == count and length <= MAX_FRAME:
                try:
                    return [_decode(bytearray(buffer[_HEAD:count]))]
                except msgspec.MsgspecError as exc:
                    raise _not_a_message(exc) from None
        self.feed(buffer[:count])
        return decode_all(self.bodies(limit))

    def bodies(self, limit: int) -> list[bytearray]:
        """Up to ``limit`` complete frame bodies, in order: each a copy of its own, writable
        (tensors that travel inline are views of it, and a model may write its inputs)."""
        out: list[bytearray] = []
        pending, at, end = self._pending, self._at, len(self._pending)
        while len(out) < limit and end - at >= 4:
            (length,) = LENGTH.unpack_from(pending, at)
            if length > MAX_FRAME:
                raise FrameError(f"a frame announces {length} bytes, over the limit of "
                                 f"{MAX_FRAME}")
            if end - at - 4 < length:
                break
            out.append(pending[at + 4:at + 4 + length])
            at += 4 + length
        self._at = at
        if at == end:
            self._pending.clear()
            self._at = 0
        return out

    def has_frame(self) -> bool:
        """Whether a complete frame is waiting (so more input need not be read yet)."""
        avail = len(self._pending) - self._at
        if avail < 4:
            return False
        (length,) = LENGTH.unpack_from(self._pending, self._at)
        return length > MAX_FRAME or avail - 4 >= length

    def buffered(self) -> int:
        return len(self._pending) - self._at
