"""Bytes to HTTP/2 frames: the client's preface, frames split across reads, and header blocks
spread over CONTINUATION frames. Pure: it knows no socket and no stream state.

A HEADERS frame is handed on with its whole header block as payload (padding and priority
fields removed, CONTINUATION frames joined), so nothing after the reader sees CONTINUATION.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from types import SimpleNamespace

from tritium.frontends.grpc.http2 import (
    END_HEADERS,
    FRAME_HEADER,
    PADDED,
    PREFACE,
    PRIORITY,
    Chunk,
    FrameType,
    H2Error,
    ProtocolViolation,
    strip_padding,
)

_HEADERS = FrameType.HEADERS.value
_CONTINUATION = FrameType.CONTINUATION.value
# The HEADERS flags that mean more than "here is the whole block" (see _on_headers).
_PLAIN_BLOCK_MASK = END_HEADERS | PADDED | PRIORITY

# A header block split into more pieces than this is a flood (CVE-2024-27316 and kin): real
# clients send a block in one or two frames.
MAX_CONTINUATIONS = 32


class NotHttp2(Exception):
    """The peer's first bytes are not the HTTP/2 preface; ``start`` holds what it sent."""

    def __init__(self, start: bytes):
        super().__init__("not an HTTP/2 client")
        self.start = start


def http1_refusal(start: bytes) -> bytes:
    """What an HTTP/1.1 client that came to this port by mistake reads (nothing for other
    garbage): a plain 400, not HTTP/2 frames."""
    if start[:4] not in (b"GET ", b"POST", b"PUT ", b"HEAD"):
        return b""
    body = b"this port speaks gRPC (HTTP/2 with prior knowledge)\n"
    return (b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


class Frame(SimpleNamespace):
    """One frame as a ``FrameCollector`` keeps it; ``payload`` is a view of the bytes read."""

    kind: int
    flags: int
    stream_id: int
    payload: memoryview

    def __repr__(self) -> str:
        return f"Frame({self.kind}, {self.flags:#x}, {self.stream_id}, {len(self.payload)} B)"


# What a frame is handed on as: its flags, stream id and payload (a view of the bytes read,
# never copied for DATA). Three arguments and no object: a unary call is four frames a read.
Handler = Callable[[int, int, memoryview], None]


def _ignore(flags: int, stream_id: int, payload: memoryview) -> None:
    """Frames of a type the endpoint does not know are ignored (RFC 9113 §4.1)."""


def _interrupted(flags: int, stream_id: int, payload: memoryview) -> None:
    raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "header block interrupted by another frame")


def _unexpected_continuation(flags: int, stream_id: int, payload: memoryview) -> None:
    raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "unexpected CONTINUATION")


class FrameReader:
    """Feed it what the socket gives; it hands each complete frame to the handler of its
    type (``handlers``, by frame type; other types are ignored).

    Raises ``NotHttp2`` when the preface is wrong and ``ProtocolViolation`` for a frame that
    breaks RFC 9113 at the framing level (size, CONTINUATION order). Bytes of an incomplete
    frame are held in the pieces they came in and joined once (large DATA frames arrive over
    many reads); what it holds is bounded by ``max_frame`` plus one header.

    ``on_preface`` is called once the client's preface is whole, before any frame is handed
    on. After ``stop`` no frame is handed on, not even the rest of the current read.
    """

    def __init__(self, max_frame: int, max_header_block: int, handlers: Mapping[int, Handler],
                 on_preface: Callable[[], None] | None = None):
        self.max_frame = max_frame
        self.max_header_block = max_header_block
        self.preface_seen = False
        self._on_preface = on_preface
        self._start = b""  # the preface, until it is whole
        self._pieces: list[Chunk] = []  # an incomplete frame
        self._held = 0
        self._needed = 0
        self._on_block = handlers.get(_HEADERS, _ignore)
        # Indexed by the frame's type byte, so the loop looks a handler up with no test. A
        # header block waiting for CONTINUATION swaps in ``_in_block``, where every other
        # type is an error: the loop then needs no test for that either.
        table: list[Handler] = [_ignore] * 256
        for kind, handler in handlers.items():
            table[kind] = handler
        table[_HEADERS] = self._on_headers
        table[_CONTINUATION] = _unexpected_continuation
        self._open: list[Handler] = table
        self._in_block: list[Handler] = [_interrupted] * 256
        self._in_block[_CONTINUATION] = self._continue_block
        self._handlers = table
        # A header block waiting for CONTINUATION: its HEADERS frame's flags and stream, and
        # the block so far.
        self._block_flags = 0
        self._block_stream = 0
        self._block = bytearray()
        self._continuations = 0

    def feed(self, data: bytes) -> None:
        if self._pieces or not self.preface_seen:
            data = self._whole(data)
        # One loop splits and hands on: no frame objects, no list of them.
        pos, size = 0, len(data)
        # The header's first word is the length above the type byte: compared whole, it is
        # too long exactly when the length is.
        max_word = self.max_frame << 8 | 0xFF
        unpack = FRAME_HEADER.unpack_from
        view = memoryview(data)
        while size - pos >= 9:
            word, flags, stream_id = unpack(data, pos)
            if word > max_word:
                raise ProtocolViolation(H2Error.FRAME_SIZE_ERROR,
                                        f"frame of {word >> 8} bytes exceeds {self.max_frame}")
            end = pos + 9 + (word >> 8)
            if end > size:
                break
            self._handlers[word & 0xFF](flags, stream_id & 0x7FFFFFFF, view[pos + 9:end])
            pos = end
        if pos < size:
            self._hold(view[pos:])

    def stop(self) -> None:
        """Hand on no more frames (the connection is closed)."""
        self._handlers = self._open = [_ignore] * 256
        self._in_block = [_ignore] * 256

    def clear(self) -> None:
        """Drop whatever is held and hand on nothing more (the connection is gone)."""
        self.stop()
        self._pieces.clear()
        self._held = 0
        self._block = bytearray()

    @property
    def in_header_block(self) -> bool:
        return self._handlers is self._in_block

    def _whole(self, data: bytes) -> bytes:
        """What can be split now, with the preface and the pieces held (b"" if nothing)."""
        if not self.preface_seen:
            data = self._take_preface(data)
            if not data:
                return b""
        if self._pieces:
            self._pieces.append(data)
            self._held += len(data)
            if self._held < self._needed:
                return b""
            data = b"".join(self._pieces)
            self._pieces.clear()
        return data

    def _take_preface(self, data: bytes) -> bytes:
        start = self._start + data
        if start[:len(PREFACE)] != PREFACE[:len(start)]:
            raise NotHttp2(start[:16])
        if len(start) < len(PREFACE):
            self._start = start
            return b""
        self.preface_seen = True
        self._start = b""
        if self._on_preface is not None:
            self._on_preface()
        return start[len(PREFACE):]

    def _hold(self, rest: memoryview) -> None:
        self._pieces.append(rest)
        self._held = len(rest)
        self._needed = 9 + int.from_bytes(rest[:3], "big") if len(rest) >= 9 else 9

    def _on_headers(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if flags & _PLAIN_BLOCK_MASK == END_HEADERS and stream_id:
            self._on_block(flags, stream_id, payload)  # the usual block: whole, unpadded
            return
        if stream_id == 0:
            raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "HEADERS on stream 0")
        block = strip_padding(payload, flags)
        if flags & PRIORITY:
            if len(block) < 5:
                raise ProtocolViolation(H2Error.FRAME_SIZE_ERROR, "HEADERS priority truncated")
            block = block[5:]
        if flags & END_HEADERS:
            self._on_block(flags, stream_id, block)
            return
        self._block_flags, self._block_stream = flags, stream_id
        self._block = bytearray(block)
        self._continuations = 0
        self._handlers = self._in_block

    def _continue_block(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if stream_id != self._block_stream:
            raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "CONTINUATION on another stream")
        self._continuations += 1
        self._block += payload
        if len(self._block) > self.max_header_block:
            raise ProtocolViolation(H2Error.ENHANCE_YOUR_CALM, "header block too large")
        if self._continuations > MAX_CONTINUATIONS:
            raise ProtocolViolation(H2Error.ENHANCE_YOUR_CALM,
                                    "header block split into too many CONTINUATION frames")
        if not flags & END_HEADERS:
            return
        block, self._block = memoryview(bytes(self._block)), bytearray()
        self._handlers = self._open
        self._on_block(self._block_flags | END_HEADERS, stream_id, block)


class FrameCollector(FrameReader):
    """A reader that keeps the frames it reads, for tests and tools: ``frames`` returns them."""

    def __init__(self, max_frame: int, max_header_block: int):
        self._found: list[Frame] = []
        super().__init__(max_frame, max_header_block, {
            kind: functools.partial(self._keep, kind) for kind in range(256)})

    def frames(self, data: bytes) -> list[Frame]:
        """The frames complete in ``data`` (and what was held before it)."""
        self.feed(data)
        found, self._found = self._found, []
        return found

    def _keep(self, kind: int, flags: int, stream_id: int, payload: memoryview) -> None:
        self._found.append(Frame(kind=kind, flags=flags, stream_id=stream_id, payload=payload))
