"""HTTP/2 wire facts (RFC 9113): frame layout, flags, settings, error codes, header blocks.

Pure functions and constants; gRPC's own layer over them is in ``wire.py``.
"""

from __future__ import annotations

import enum
import struct
from typing import TypeAlias, TypeVar

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

Buffer = TypeVar("Buffer", bytes, memoryview)
Chunk: TypeAlias = bytes | memoryview  # what the socket is handed


class FrameType(enum.IntEnum):
    DATA = 0
    HEADERS = 1
    PRIORITY = 2
    RST_STREAM = 3
    SETTINGS = 4
    PUSH_PROMISE = 5
    PING = 6
    GOAWAY = 7
    WINDOW_UPDATE = 8
    CONTINUATION = 9


# Flag bits; ACK shares END_STREAM's bit on SETTINGS and PING.
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY = 0x20


class Setting(enum.IntEnum):
    HEADER_TABLE_SIZE = 1
    ENABLE_PUSH = 2
    MAX_CONCURRENT_STREAMS = 3
    INITIAL_WINDOW_SIZE = 4
    MAX_FRAME_SIZE = 5
    MAX_HEADER_LIST_SIZE = 6


class H2Error(enum.IntEnum):
    """Error codes of RST_STREAM and GOAWAY."""

    NO_ERROR = 0
    PROTOCOL_ERROR = 1
    INTERNAL_ERROR = 2
    FLOW_CONTROL_ERROR = 3
    STREAM_CLOSED = 5
    FRAME_SIZE_ERROR = 6
    REFUSED_STREAM = 7
    CANCEL = 8
    COMPRESSION_ERROR = 9
    ENHANCE_YOUR_CALM = 11


class ProtocolViolation(Exception):
    """The peer broke the protocol: the connection ends with GOAWAY carrying ``code``."""

    def __init__(self, code: H2Error, message: str):
        super().__init__(message)
        self.code = code


DEFAULT_WINDOW = 65535
DEFAULT_MAX_FRAME = 16384
MAX_WINDOW = 2**31 - 1
MAX_FRAME_LIMIT = 2**24 - 1


# A frame header: 24-bit length and 8-bit type (packed in one word), flags, stream id.
FRAME_HEADER = struct.Struct(">IBI")


def frame(kind: int, flags: int, stream_id: int, payload: Chunk = b"") -> bytes:
    """One frame: 24-bit length, type, flags, 31-bit stream id, payload."""
    return FRAME_HEADER.pack((len(payload) << 8) | kind, flags, stream_id) + payload


def settings_payload(values: dict[Setting, int]) -> bytes:
    return b"".join(int(key).to_bytes(2, "big") + value.to_bytes(4, "big")
                    for key, value in values.items())


def parse_settings(payload: bytes) -> dict[int, int]:
    if len(payload) % 6:
        raise ProtocolViolation(H2Error.FRAME_SIZE_ERROR, "SETTINGS length is not a multiple of 6")
    return {int.from_bytes(payload[i:i + 2], "big"): int.from_bytes(payload[i + 2:i + 6], "big")
            for i in range(0, len(payload), 6)}


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(FrameType.WINDOW_UPDATE, 0, stream_id, increment.to_bytes(4, "big"))


def rst_stream(stream_id: int, code: H2Error) -> bytes:
    return frame(FrameType.RST_STREAM, 0, stream_id, int(code).to_bytes(4, "big"))


def goaway(last_stream_id: int, code: H2Error, debug: str = "") -> bytes:
    payload = last_stream_id.to_bytes(4, "big") + int(code).to_bytes(4, "big") + debug.encode()
    return frame(FrameType.GOAWAY, 0, 0, payload)


def strip_padding(payload: Buffer, flags: int) -> Buffer:
    """The frame's content without its pad length octet and padding."""
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "padding exceeds the frame")
    return payload[1:len(payload) - payload[0]]


def references_only(block: bytes) -> bool:
    """True if an HPACK header block holds only indexed fields (RFC 7541 §6.1), the one kind
    of field that leaves the decoder's dynamic table as it was."""
    i, size = 0, len(block)
    while i < size:
        first = block[i]
        if not first & 0x80:
            return False
        i += 1
        if first & 0x7F == 0x7F:  # the index continues in 7-bit groups
            while i < size and block[i] & 0x80:
                i += 1
            i += 1
    return True


# Header blocks the server sends. The encoder never adds to its dynamic table, so a block
# encoded once is valid on every connection.
_ENCODER = hpack.Encoder()


def header_block(*headers: tuple[bytes, bytes]) -> bytes:
    """An HPACK block of literal fields that leaves both tables as they were."""
    return _ENCODER.encode([hpack.NeverIndexedHeaderTuple(k, v) for k, v in headers],
                           huffman=False)
