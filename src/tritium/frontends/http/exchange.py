"""One HTTP request and the writing of its response: framing, keep-alive, and the cancellation
the peer's departure sets."""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING

import orjson

from tritium.core.cancellation import Cancellation, CancelReason

if TYPE_CHECKING:
    import asyncio

    from tritium.frontends.http.connection import HttpConnection

logger = logging.getLogger("tritium.http")

BodyPart = bytes | memoryview
Body = BodyPart | list[BodyPart]

# Bodies below this size are copied behind the head so the response leaves in one send;
# larger ones are handed over as separate buffers of one writev, uncopied.
_JOIN_BELOW = 16 * 1024
_STATUS_LINES = {s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n" for s in HTTPStatus}
_CLOSE = "Connection: close\r\n"
_KEEP_ALIVE = "Connection: keep-alive\r\n"
_CHUNKED = "Transfer-Encoding: chunked\r\n"
_LAST_CHUNK = b"0\r\n\r\n"
_JSON = [("Content-Type", "application/json")]


@dataclass(slots=True)
class HttpRequest:
    method: str
    path: str  # without the query string, still percent-encoded
    query: str
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes | memoryview  # a large one: a read-only view of the buffer it arrived in
    http_version: str  # "1.0" or "1.1"
    keep_alive: bool


class _Progress(enum.Enum):
    """How much of an exchange's response has been handed to the transport."""

    NONE = "nothing sent"
    STREAMING = "head and some chunks sent"
    COMPLETE = "whole response queued"


# Enum members read on every request, as module globals (core/types.py says why).
_NONE = _Progress.NONE
_STREAMING = _Progress.STREAMING
_COMPLETE = _Progress.COMPLETE


def encode_head(status: int, headers: list[tuple[str, str]], tail: str) -> bytes:
    """Status line, the app's headers, the transport's own (``tail``), then the blank line."""
    head = _STATUS_LINES.get(status) or f"HTTP/1.1 {status} \r\n"
    for name, value in headers:
        head += f"{name}: {value}\r\n"
    return f"{head}{tail}\r\n".encode("latin-1")


def encode_error(status: int, message: str) -> bytes:
    """A whole JSON error response after which the connection closes."""
    body = orjson.dumps({"error": message})
    return encode_head(status, _JSON, f"Content-Length: {len(body)}\r\n{_CLOSE}") + body


def _nbytes(part: BodyPart) -> int:
    return part.nbytes if isinstance(part, memoryview) else len(part)


# Statuses whose responses have no body, whatever their Content-Length says.
_BODYLESS = frozenset((*range(100, 200), 204, 304))


def _byte_view(part: BodyPart) -> BodyPart:
    # A typed memoryview (of float32, say) may be refused by a transport; a flat byte
    # view of the same memory costs no copy.
    if isinstance(part, memoryview) and part.format != "B":
        return part.cast("B")
    return part


class HttpExchange:
    """One request/response on a connection.

    ``cancellation`` is the exchange's own, made for the connection's loop: the transport
    cancels it (CLIENT_DISCONNECTED) when the peer leaves before the response is complete, and
    handlers hand it to the core with the request. Nothing else cancels an exchange.
    """

    __slots__ = ("_chunked", "_conn", "_progress", "cancellation", "disconnected", "request")

    def __init__(self, request: HttpRequest, conn: HttpConnection, cancellation: Cancellation):
        self.request = request
        self.cancellation = cancellation
        self.disconnected = False
        self._conn = conn
        self._progress = _NONE
        self._chunked = True

    @property
    def responded(self) -> bool:
        """A complete response has been queued."""
        return self._progress is _COMPLETE

    def respond(self, status: int, headers: list[tuple[str, str]], body: Body = b"") -> None:
        """Queue the whole response; the transport adds Content-Length and Connection."""
        # _advance, inline: this runs for every response.
        if self._progress is not _NONE:
            self._advance(_NONE, _COMPLETE)  # raises
        self._progress = _COMPLETE
        if self.disconnected:
            return
        request = self.request
        conn = self._conn
        closing = conn.closing or not request.keep_alive
        connection = _CLOSE if closing else _KEEP_ALIVE if request.http_version == "1.0" else ""
        parts: list[BodyPart]
        if type(body) is bytes:  # the hot path: one buffer
            size = len(body)
            parts = [body]
        else:
            parts = body if isinstance(body, list) else [body]
            size = sum(map(_nbytes, parts))
        head = encode_head(status, headers, f"Content-Length: {size}\r\n{connection}")
        if status in _BODYLESS or request.method == "HEAD":
            size = 0  # no body on the wire, whatever Content-Length says
        self._write(head, parts, size)
        if closing:
            conn.close()

    def start_stream(self, status: int, headers: list[tuple[str, str]]) -> None:
        """Send a head whose body follows in chunks (to an HTTP/1.0 peer: unframed, then close)."""
        self._advance(_NONE, _STREAMING)
        if self.disconnected:
            return
        if self.request.http_version == "1.0":
            self._chunked = False
            tail = _CLOSE
        elif self._conn.closing or not self.request.keep_alive:
            tail = _CHUNKED + _CLOSE
        else:
            tail = _CHUNKED
        self._write(encode_head(status, headers, tail))

    def write_chunk(self, data: bytes) -> None:
        """Send one piece of a streamed body now; an empty piece sends nothing."""
        if self._progress is not _STREAMING:
            raise RuntimeError(f"write_chunk() when the response has {self._progress.value}")
        if self.disconnected or not data:
            return
        if not self._chunked:
            self._write(data)
        elif len(data) < _JOIN_BELOW:
            self._write(b"%x\r\n%b\r\n" % (len(data), data))
        else:
            self._conn.transport.writelines([b"%x\r\n" % len(data), data, b"\r\n"])

    def end_stream(self) -> None:
        """Finish a streamed body."""
        self._advance(_STREAMING, _COMPLETE)
        if self.disconnected:
            return
        if self._chunked:
            self._write(_LAST_CHUNK)
        if not self._chunked or self._conn.closing or not self.request.keep_alive:
            self._conn.close()

    async def wait_writable(self) -> None:
        """Return at once unless the transport asked us to stop writing; then wait for it."""
        await self._conn.wait_writable()

    def respond_internal_error(self, message: str) -> None:
        """Answer 500 if no byte of a response was sent yet (for the transport's own use)."""
        if self._progress is _NONE and not self.disconnected:
            self.respond(500, _JSON, orjson.dumps({"error": message}))

    def peer_left(self) -> None:
        """Mark the exchange abandoned; cancel its work if its response was unfinished."""
        if self.disconnected:
            return
        self.disconnected = True
        if self._progress is _COMPLETE:
            return  # answered in full: nothing is left to stop
        try:
            self.cancellation.cancel(CancelReason.CLIENT_DISCONNECTED)
        except Exception:
            logger.exception("HTTP disconnect: a cancellation callback failed")

    def _advance(self, expected: _Progress, to: _Progress) -> None:
        if self._progress is not expected:
            raise RuntimeError(f"the response has {self._progress.value} already")
        self._progress = to

    def _write(self, head: bytes, parts: list[BodyPart] | None = None, size: int = 0) -> None:
        transport: asyncio.Transport = self._conn.transport
        if not parts or not size:
            transport.write(head)
        elif size >= _JOIN_BELOW:
            transport.writelines([head, *map(_byte_view, parts)])
        elif len(parts) == 1:
            transport.write(head + parts[0])
        else:
            transport.write(b"".join([head, *parts]))


# What a listener serves every exchange with: it must respond (or see the peer leave).
App = Callable[[HttpExchange], Awaitable[None]]
