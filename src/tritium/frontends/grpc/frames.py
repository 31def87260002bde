"""Bytes to HTTP/2 frames: the client's preface, frames split across reads, and header blocks
spread over CONTINUATION frames. Pure: it knows no socket and no stream state.

A HEADERS frame comes out of the reader with its whole header block as payload (padding and
priority fields removed, CONTINUATION frames joined), so nothing after it sees CONTINUATION.
"""

from __future__ import annotations

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
# The HEADERS flags that mean more than "here is the whole block" (see _start_block).
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
    """One frame; ``payload`` is a view of the bytes read (never copied for DATA).

    Made with keywords, ``Frame(kind=, flags=, stream_id=, payload=)``: a namespace's own C
    initializer, so the four frames of a unary call run no Python ``__init__``."""

    kind: int
    flags: int
    stream_id: int
    payload: memoryview

    def __repr__(self) -> str:
        return f"Frame({self.kind}, {self.flags:#x}, {self.stream_id}, {len(self.payload)} B)"


class FrameReader:
    """Feed it what the socket gives; it returns the frames that are complete.

    Raises ``NotHttp2`` when the preface is wrong and ``ProtocolViolation`` for a frame that
    breaks RFC 9113 at the framing level (size, CONTINUATION order). Bytes of an incomplete
    frame are held in the pieces they came in and joined once (large DATA frames arrive over
    many reads); what it holds is bounded by ``max_frame`` plus one header.
    """

    def __init__(self, max_frame: int, max_header_block: int):
        self.max_frame = max_frame
        self.max_header_block = max_header_block
        self.preface_seen = False
        self._start = b""  # the preface, until it is whole
        self._pieces: list[Chunk] = []  # an incomplete frame
        self._held = 0
        self._needed = 0
        # A header block waiting for CONTINUATION: the HEADERS frame and the block so far.
        self._block_frame: Frame | None = None
        self._block = bytearray()
        self._continuations = 0

    def feed(self, data: bytes) -> list[Frame]:
        if not self.preface_seen:
            data = self._take_preface(data)
            if not data:
                return []
        if self._pieces:
            self._pieces.append(data)
            self._held += len(data)
            if self._held < self._needed:
                return []
            data = b"".join(self._pieces)
            self._pieces.clear()
        frames: list[Frame] = []
        pos = self._split(data, frames)
        if pos < len(data):
            self._hold(memoryview(data)[pos:])
        return frames

    def clear(self) -> None:
        """Drop whatever is held (the connection is gone)."""
        self._pieces.clear()
        self._held = 0
        self._block = bytearray()
        self._block_frame = None

    @property
    def in_header_block(self) -> bool:
        return self._block_frame is not None

    def _take_preface(self, data: bytes) -> bytes:
        start = self._start + data
        if start[:len(PREFACE)] != PREFACE[:len(start)]:
            raise NotHttp2(start[:16])
        if len(start) < len(PREFACE):
            self._start = start
            return b""
        self.preface_seen = True
        self._start = b""
        return start[len(PREFACE):]

    def _hold(self, rest: memoryview) -> None:
        self._pieces.append(rest)
        self._held = len(rest)
        self._needed = 9 + int.from_bytes(rest[:3], "big") if len(rest) >= 9 else 9

    def _split(self, data: bytes, frames: list[Frame]) -> int:
        pos, size = 0, len(data)
        unpack = FRAME_HEADER.unpack_from
        view = memoryview(data)
        while size - pos >= 9:
            word, flags, stream_id = unpack(data, pos)
            length = word >> 8
            if length > self.max_frame:
                raise ProtocolViolation(H2Error.FRAME_SIZE_ERROR,
                                        f"frame of {length} bytes exceeds {self.max_frame}")
            end = pos + 9 + length
            if end > size:
                break
            kind = word & 0xFF
            found = Frame(kind=kind, flags=flags, stream_id=stream_id & 0x7FFFFFFF,
                          payload=view[pos + 9:end])
            pos = end
            if self._block_frame is not None or kind == _CONTINUATION:
                whole = self._assemble(found)
                if whole is not None:
                    frames.append(whole)
            elif kind == _HEADERS:
                if flags & _PLAIN_BLOCK_MASK == END_HEADERS and found.stream_id:
                    frames.append(found)  # the usual block: whole, unpadded, no priority
                    continue
                whole = self._start_block(found)
                if whole is not None:
                    frames.append(whole)
            else:
                frames.append(found)
        return pos

    def _assemble(self, found: Frame) -> Frame | None:
        """The frame as the connection should see it, or None while a block is incomplete."""
        kind = found.kind
        if self._block_frame is not None:
            if kind != FrameType.CONTINUATION:
                raise ProtocolViolation(H2Error.PROTOCOL_ERROR,
                                        "header block interrupted by another frame")
            return self._continue_block(found)
        if kind == FrameType.CONTINUATION:
            raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "unexpected CONTINUATION")
        if kind == FrameType.HEADERS:
            return self._start_block(found)
        return found

    def _start_block(self, found: Frame) -> Frame | None:
        if found.stream_id == 0:
            raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "HEADERS on stream 0")
        block = strip_padding(found.payload, found.flags)
        if found.flags & PRIORITY:
            if len(block) < 5:
                raise ProtocolViolation(H2Error.FRAME_SIZE_ERROR, "HEADERS priority truncated")
            block = block[5:]
        if found.flags & END_HEADERS:
            found.payload = block
            return found
        self._block_frame = found
        self._block = bytearray(block)
        self._continuations = 0
        return None

    def _continue_block(self, found: Frame) -> Frame | None:
        first = self._block_frame
        assert first is not None
        if found.stream_id != first.stream_id:
            raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "CONTINUATION on another stream")
        self._continuations += 1
        self._block += found.payload
        if len(self._block) > self.max_header_block:
            raise ProtocolViolation(H2Error.ENHANCE_YOUR_CALM, "header block too large")
        if self._continuations > MAX_CONTINUATIONS:
            raise ProtocolViolation(H2Error.ENHANCE_YOUR_CALM,
                                    "header block split into too many CONTINUATION frames")
        if not found.flags & END_HEADERS:
            return None
        first.payload = memoryview(bytes(self._block))
        first.flags |= END_HEADERS
        self._block_frame = None
        self._block = bytearray()
        return first
