"""gRPC's layer over HTTP/2: the reply's header blocks, ``grpc-timeout``, ``grpc-message``
and the length prefix of a message. Pure functions and constants."""

from __future__ import annotations

import functools

from tritium.frontends.grpc.http2 import Chunk, header_block

_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
ACCEPTED_ENCODINGS = b"identity,deflate,gzip"
ENCODINGS = ("identity", "gzip", "deflate")


# gRPC clients repeat a timeout's text from call to call (grpc-core keeps the ones it sent in
# its HPACK table), so the parse of each is remembered.
@functools.lru_cache(maxsize=256)
def parse_timeout(value: str) -> float:
    """``grpc-timeout`` (up to 8 digits and a unit) in seconds; ValueError if malformed."""
    digits, unit = value[:-1], value[-1:]
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 8 or \
            unit not in _TIMEOUT_UNITS:
        raise ValueError(f"malformed grpc-timeout '{value}'")
    return int(digits) * _TIMEOUT_UNITS[unit]


def encode_status_message(message: str) -> bytes:
    """``grpc-message``: UTF-8, percent-encoding everything outside printable ASCII and '%'."""
    out = bytearray()
    for byte in message.encode("utf-8", "replace"):
        if 0x20 <= byte <= 0x7E and byte != 0x25:
            out.append(byte)
        else:
            out += b"%%%02X" % byte
    return bytes(out)


RESPONSE_HEADERS = header_block((b":status", b"200"), (b"content-type", b"application/grpc"),
                                (b"grpc-accept-encoding", ACCEPTED_ENCODINGS))
OK_TRAILERS = header_block((b"grpc-status", b"0"))
_MAX_STATUS_MESSAGE = 4096


def trailers_block(status: int, message: str, headers_sent: bool) -> bytes:
    """The block that ends a call (with the response headers when none were sent)."""
    if status == 0 and not message and headers_sent:
        return OK_TRAILERS  # the usual end, encoded once
    fields = [(b"grpc-status", str(int(status)).encode())]
    if message:
        fields.append((b"grpc-message", encode_status_message(message[:_MAX_STATUS_MESSAGE])))
    if not headers_sent:  # trailers-only response
        fields = [(b":status", b"200"), (b"content-type", b"application/grpc"),
                  (b"grpc-accept-encoding", ACCEPTED_ENCODINGS), *fields]
    return header_block(*fields)


def message_of(pieces: list[Chunk], size: int) -> bytes:
    """A gRPC message on the wire (uncompressed flag, 4-byte length, bytes) for a body
    serialized in ``pieces``, ``size`` bytes in all."""
    return b"".join([b"\x00", size.to_bytes(4, "big"), *pieces])


def length_prefixed(body: bytes) -> bytes:
    """``message_of`` a body in one piece."""
    return message_of([body], len(body))
