"""Reading HTTP/1.1 requests off a connection with httptools, within the head and body limits."""

from __future__ import annotations

import asyncio
import enum
import logging
from typing import Protocol

import httptools

from tritium.frontends.http.exchange import HttpRequest
from tritium.frontends.http.limits import HttpLimits
from tritium.frontends.http.pacing import Pacing

logger = logging.getLogger("tritium.http")

_METHODS = {m.encode(): m for m in ("GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH")}
# Raw header name -> lower-case str: a dict hit is cheaper than decoding and lower-casing.
_HEADER_NAMES: dict[bytes, str] = {}
_HEADER_NAMES_MAX = 1024
# Reads larger than this are parsed in slices of it, so that parsing stops soon after the
# pipeline fills (at most a slice's worth of tiny requests past the bound).
_SLICE = 4096
# A body of several reads up to this size is copied into bytes once it is whole; a larger one
# is handed over as a view of the buffer it was received in.
_SMALL_BODY = 1 << 20
# What a closed connection parses with: it calls back into nothing, so the connection it
# replaces is no longer referenced by its own parser (a cycle only a full collection finds).
_DETACHED = httptools.HttpRequestParser(object())


class Clock(Protocol):
    """The listener's coarse clock (see transport.OpenConnections)."""

    now: float


class Phase(enum.Enum):
    """Where the parser is within the request it is reading."""

    IDLE = "between requests"
    HEAD = "reading the request line and headers"
    BODY = "reading the body"


# Enum members read on every request, as module globals (core/types.py says why).
_IDLE = Phase.IDLE
_HEAD = Phase.HEAD
_BODY = Phase.BODY


class Rejection(Exception):
    """A request the transport answers itself (bad bytes, a limit) before closing."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class RequestReader(asyncio.Protocol):
    """The reading half of a connection: bytes to ``HttpRequest``s, refused with a
    ``Rejection`` where they break a limit. The serving half implements the three hooks."""

    def __init__(self, limits: HttpLimits, clock: Clock):
        self._limits = limits
        self._max_header_bytes = limits.max_header_bytes
        self._max_body_bytes = limits.max_body_bytes
        self._clock = clock
        self._parser = httptools.HttpRequestParser(self)
        # No further request will be served: after "Connection: close", a rejection or the
        # peer leaving. Input is then read (so a departure is still seen) and dropped.
        self._discard_input = False
        self._pipeline_full = False  # the serving half has enough requests waiting
        self._unparsed = b""  # read but left for when the pipeline has room
        self._rejection: Rejection | None = None
        self.pacing = Pacing(limits, clock.now)
        self._method = self._version = ""
        self._keep_alive = True
        self.on_message_begin()  # gives the per-request fields their first values
        self._phase = _IDLE
        self._raw_head_bytes = 0  # bytes received since the head began, parsed or not

    # -- the serving half's hooks -----------------------------------------------------------

    def _received(self, request: HttpRequest, body_size: int) -> None:
        raise NotImplementedError

    def _reject(self, rejection: Rejection) -> None:
        raise NotImplementedError

    def _send_continue(self) -> None:
        raise NotImplementedError

    # -- bytes in ---------------------------------------------------------------------------

    def data_received(self, data: bytes | memoryview) -> None:
        if self._discard_input:
            return
        if (len(data) > _SLICE or self._unparsed) and self._took_large(data):
            return
        if self._phase is not _BODY:
            self._raw_head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # We never switch protocols: the request was answered as plain HTTP with a close
            # (see on_headers_complete), and what follows it is never read as a request.
            self._discard_input = True
        except httptools.HttpParserError as exc:
            if self._rejection is None and isinstance(exc, httptools.HttpParserCallbackError):
                logger.error("HTTP parser callback failed", exc_info=exc.__context__)
            self._reject(self._rejection or Rejection(400, f"malformed HTTP request: {exc}"))
            return
        if self._phase is not _BODY and self._raw_head_bytes > self._max_header_bytes:
            self._reject(self._head_too_large())

    def _took_large(self, data: bytes | memoryview) -> bool:
        """Handle a large read (True), unless it is nothing but body and is parsed whole.

        A large read is parsed a slice at a time, and what follows a full pipeline is kept
        unparsed: a read of tiny pipelined requests would otherwise queue thousands.
        """
        if self._unparsed:  # bytes still wait for the pipeline: these come after them
            self._unparsed += data
            return True
        if self._phase is _BODY and self._content_length - self._body_size >= len(data):
            return False
        view = memoryview(data)
        for start in range(0, len(view), _SLICE):
            if self._discard_input:
                break
            if self._pipeline_full:
                self._unparsed = bytes(view[start:])
                break
            self.data_received(view[start:start + _SLICE])
        return True

    # -- httptools callbacks ------------------------------------------------------------

    def on_message_begin(self) -> None:
        # Per-request state is reset here, where the parser calls anyway, not after a message.
        self._phase = _HEAD
        self._head_started = self._body_started = self._clock.now
        self._head_size = 0  # request line + headers seen by the callbacks
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body: bytes | bytearray = b""
        self._body_size = 0
        self._content_length = 0
        self._chunks = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_size += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._phase is _BODY:
            return  # a trailer after a chunked body: not part of the request's headers
        self._head_size += len(name) + len(value) + 4
        if self._head_size > self._max_header_bytes:
            self._fail(self._head_too_large())
        key = _HEADER_NAMES.get(name) or _header_name(name)
        headers = self._headers
        if key in headers:
            if key == "host":  # RFC 9112 §3.2: which host is meant cannot be told
                self._fail(Rejection(400, "request has more than one Host header"))
            headers[key] += ", " + value.decode("latin-1")
        else:
            headers[key] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self._phase = _BODY
        self._body_started = self._clock.now
        if self._head_size > self._max_header_bytes:
            self._fail(self._head_too_large())
        headers = self._headers
        length = headers.get("content-length")
        self._content_length = 0 if length is None else int(length)
        if self._content_length > self._max_body_bytes:
            self._fail(self._body_too_large())
        parser = self._parser
        method = parser.get_method()
        self._method = _METHODS.get(method) or method.decode("latin-1")
        self._version = parser.get_http_version()
        if "host" not in headers and self._version != "1.0":
            self._fail(Rejection(400, "HTTP/1.1 request without a Host header"))
        if "transfer-encoding" in headers:
            self._check_transfer_coding(headers["transfer-encoding"])
        self._keep_alive = parser.should_keep_alive()
        if "upgrade" in headers or self._method == "CONNECT":
            # Answered as plain HTTP, then closed: a peer (or a proxy) that believes the
            # protocol switched must not get the bytes after this parsed as requests.
            self._keep_alive = False
        if "expect" in headers and self._version == "1.1":
            self._expect(headers["expect"])

    def _check_transfer_coding(self, coding: str) -> None:
        # RFC 9112 6.1: an HTTP/1.0 message's framing is faulty with any Transfer-Encoding,
        # and chunked, the one coding served, must be the only one ("identity" is gone).
        if self._version == "1.0":
            self._fail(Rejection(400, "Transfer-Encoding in an HTTP/1.0 request"))
        if coding.strip().lower() != "chunked":
            self._fail(Rejection(501, f"unsupported Transfer-Encoding '{coding}': only "
                                      "chunked is"))

    def _expect(self, expectation: str) -> None:
        if expectation.lower() == "100-continue":
            self._send_continue()

    def on_chunk_header(self) -> None:
        self._chunks += 1
        if self._chunks > self._limits.max_chunks:
            limit = self._limits.max_chunks
            self._fail(Rejection(400, f"chunked request body has more than {limit} chunks"))

    def on_body(self, body: bytes) -> None:
        self._body_size += len(body)
        if self._body_size > self._max_body_bytes:
            self._fail(self._body_too_large())
        held = self._body
        if not held:
            self._body = body
        elif type(held) is bytes:
            # A body of several reads grows in one buffer: parts joined at the end would
            # hold it twice (a large buffer grows in place, without a copy).
            self._body = bytearray(held) + body
        else:
            held += body

    def on_message_complete(self) -> None:
        if self._discard_input:
            return  # pipelined after a request that closes the connection
        url = self._url
        if url[:1] != b"/":
            url = _origin_form(url)
        path, _, query = url.partition(b"?")
        body = self._body
        request = HttpRequest(
            self._method,
            path.decode("latin-1"),
            query.decode("latin-1") if query else "",
            self._headers,
            body if isinstance(body, bytes) else _grown_body(body),
            self._version,
            self._keep_alive,
        )
        self._body = b""  # the request holds it now, and only the request
        self._phase = _IDLE
        self._raw_head_bytes = 0
        if not request.keep_alive:
            self._discard_input = True
        self._received(request, self._body_size)

    def _fail(self, rejection: Rejection) -> None:
        # Raising inside a callback stops the parser; data_received picks the reason up.
        self._rejection = rejection
        raise rejection

    def _head_too_large(self) -> Rejection:
        limit = self._max_header_bytes
        return Rejection(431, f"request line and headers exceed {limit} bytes")

    def _body_too_large(self) -> Rejection:
        limit = self._max_body_bytes
        return Rejection(
            413,
            f"request body exceeds the limit of {limit} bytes; "
            "start the server with a larger --http-max-input-size to allow it",
        )

    def _stop_reading(self) -> None:
        """Drop the parser and whatever it holds: the connection is gone."""
        self._discard_input = True
        self._parser = _DETACHED
        self._body = b""  # a partly received body goes now, not with the connection
        self._unparsed = b""

    def _resume_parsing(self) -> None:
        """Parse what a full pipeline left unparsed (it may fill the pipeline again)."""
        self._pipeline_full = False
        unparsed, self._unparsed = self._unparsed, b""
        if unparsed:
            self.data_received(unparsed)


def _grown_body(body: bytearray) -> bytes | memoryview:
    """A body of several reads as requests hold it: bytes, or when large a read-only view of
    the buffer it grew in (copied into bytes, it would be held twice while it is)."""
    if len(body) <= _SMALL_BODY:
        return bytes(body)
    return memoryview(body).toreadonly()


def _header_name(raw: bytes) -> str:
    name = raw.decode("latin-1").lower()
    if len(_HEADER_NAMES) < _HEADER_NAMES_MAX:
        _HEADER_NAMES[raw] = name
    return name


def _origin_form(url: bytes) -> bytes:
    """Reduce an absolute-form target ("http://host/p?q") to "/p?q"; leave "*" alone."""
    try:
        parsed = httptools.parse_url(url)
    except httptools.HttpParserInvalidURLError:
        return url
    path = parsed.path or b"/"
    return path + b"?" + parsed.query if parsed.query else path
