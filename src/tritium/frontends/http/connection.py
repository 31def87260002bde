"""One HTTP/1.1 connection: httptools parsing, requests served in order, the peer's departure."""

from __future__ import annotations

import asyncio
import enum
import logging
from collections import deque
from typing import TYPE_CHECKING, cast

import httptools

from tritium.core.cancellation import Cancellation
from tritium.frontends.http.exchange import App, HttpExchange, HttpRequest, encode_error
from tritium.frontends.http.limits import HttpLimits
from tritium.frontends.http.pacing import Pacing

if TYPE_CHECKING:
    from tritium.frontends.http.transport import OpenConnections

logger = logging.getLogger("tritium.http")

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_METHODS = {m.encode(): m for m in ("GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH")}
# Raw header name -> lower-case str: a dict hit is cheaper than decoding and lower-casing.
_HEADER_NAMES: dict[bytes, str] = {}
_HEADER_NAMES_MAX = 1024
# What a closed connection parses with: it calls back into nothing, so the connection it
# replaces is no longer referenced by its own parser (a cycle only a full collection finds).
_DETACHED = httptools.HttpRequestParser(object())


class _Phase(enum.Enum):
    """Where the parser is within the request it is reading."""

    IDLE = "between requests"
    HEAD = "reading the request line and headers"
    BODY = "reading the body"


class _Rejection(Exception):
    """A request the transport answers itself (bad bytes, a limit) before closing."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class HttpConnection(asyncio.Protocol):
    """Parses requests as bytes arrive and serves them one at a time, in order, with one task.

    Reading stops only for backpressure: too many requests parsed ahead of the one being
    served, or a peer that does not read its responses (the write buffer passed its high-water
    mark). Otherwise the peer's FIN or RST is seen the moment it arrives. At the TCP level a
    half-close (the client shut down only its sending side) cannot be told apart from a
    close: both are a FIN, so either one counts as the client leaving.
    """

    def __init__(self, app: App, limits: HttpLimits, connections: OpenConnections):
        self._app = app
        self._limits = limits
        self._max_header_bytes = limits.max_header_bytes
        self._max_body_bytes = limits.max_body_bytes
        self._connections = connections
        self._loop = asyncio.get_running_loop()
        self._parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport  # connection_made sets it before any other call
        self._queue: deque[HttpExchange | _Rejection] = deque()
        self._queued_bytes = 0  # request bodies in the queue
        self._current: HttpExchange | None = None
        self._runner: asyncio.Task[None] | None = None
        # Set only while the runner waits for work; whoever resolves it clears it.
        self._wakeup: asyncio.Future[None] | None = None
        # Exists while the transport's write buffer is over its high-water mark.
        self._writable: asyncio.Future[None] | None = None
        self._lost = False
        self._finished = False
        # No further request will be served: after "Connection: close", a rejection or the
        # peer leaving. Input is then read (so a departure is still seen) and dropped.
        self._discard_input = False
        self.closing = False  # the response being written is the last one
        self._reading_paused = False
        self._pipeline_full = False
        self._continue_wanted = False
        self._rejection: _Rejection | None = None
        self.pacing = Pacing(limits, connections.now)
        self._method = self._version = ""
        self._keep_alive = True
        self.on_message_begin()  # gives the per-request fields their first values
        self._phase = _Phase.IDLE
        self._raw_head_bytes = 0  # bytes received since the head began, parsed or not

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self._connections.add(self)

    def data_received(self, data: bytes) -> None:
        if self._discard_input:
            return
        if self._phase is not _Phase.BODY:
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
            self._reject(self._rejection or _Rejection(400, f"malformed HTTP request: {exc}"))
            return
        if self._phase is not _Phase.BODY and self._raw_head_bytes > self._max_header_bytes:
            self._reject(self._head_too_large())

    def eof_received(self) -> bool:
        # A FIN, whether from close() or shutdown(SHUT_WR): the client is leaving. Tell the
        # app now rather than when the transport finishes closing.
        self._peer_left()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._peer_left()
        self._parser = _DETACHED
        self._body_parts.clear()  # a partly received body goes now, not with the connection
        writable, self._writable = self._writable, None
        self._release(writable)
        self._maybe_finish()

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = self._loop.create_future()
            self.pacing.write_paused(self._connections.now, self.transport.get_write_buffer_size())
            self._update_reading()

    def resume_writing(self) -> None:
        writable, self._writable = self._writable, None
        self._release(writable)
        self.pacing.waiting_since = self._connections.now  # the server, not the peer, was late
        self._update_reading()

    # -- httptools callbacks --------------------------------------------------------------

    def on_message_begin(self) -> None:
        # Per-request state is reset here, where the parser calls anyway, not after a message.
        self._phase = _Phase.HEAD
        self._head_started = self._connections.now
        self._head_size = 0  # request line + headers seen by the callbacks
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body_parts: list[bytes] = []
        self._body_size = 0
        self._chunks = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_size += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._phase is _Phase.BODY:
            return  # a trailer after a chunked body: not part of the request's headers
        self._head_size += len(name) + len(value) + 4
        if self._head_size > self._max_header_bytes:
            self._fail(self._head_too_large())
        key = _HEADER_NAMES.get(name) or _header_name(name)
        headers = self._headers
        if key in headers:
            if key == "host":  # RFC 9112 §3.2: which host is meant cannot be told
                self._fail(_Rejection(400, "request has more than one Host header"))
            headers[key] += ", " + value.decode("latin-1")
        else:
            headers[key] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self._phase = _Phase.BODY
        self.pacing.body_started(self._connections.now)
        if self._head_size > self._max_header_bytes:
            self._fail(self._head_too_large())
        headers = self._headers
        if "content-length" in headers and int(headers["content-length"]) > self._max_body_bytes:
            self._fail(self._body_too_large())
        parser = self._parser
        method = parser.get_method()
        self._method = _METHODS.get(method) or method.decode("latin-1")
        self._version = parser.get_http_version()
        if "host" not in headers and self._version != "1.0":
            self._fail(_Rejection(400, "HTTP/1.1 request without a Host header"))
        self._keep_alive = parser.should_keep_alive()
        if "upgrade" in headers or self._method == "CONNECT":
            # Answered as plain HTTP, then closed: a peer (or a proxy) that believes the
            # protocol switched must not get the bytes after this parsed as requests.
            self._keep_alive = False
        if "expect" in headers and self._version == "1.1":
            self._expect(headers["expect"])

    def _expect(self, expectation: str) -> None:
        if expectation.lower() == "100-continue":
            self._send_continue()

    def on_chunk_header(self) -> None:
        self._chunks += 1
        if self._chunks > self._limits.max_chunks:
            limit = self._limits.max_chunks
            self._fail(_Rejection(400, f"chunked request body has more than {limit} chunks"))

    def on_body(self, body: bytes) -> None:
        self._body_size += len(body)
        if self._body_size > self._max_body_bytes:
            self._fail(self._body_too_large())
        self._body_parts.append(body)

    def on_message_complete(self) -> None:
        if self._discard_input:
            return  # pipelined after a request that closes the connection
        self._continue_wanted = False
        url = self._url
        if url[:1] != b"/":
            url = _origin_form(url)
        path, _, query = url.partition(b"?")
        parts = self._body_parts
        request = HttpRequest(
            self._method,
            path.decode("latin-1"),
            query.decode("latin-1") if query else "",
            self._headers,
            parts[0] if len(parts) == 1 else b"".join(parts),
            self._version,
            self._keep_alive,
        )
        self._phase = _Phase.IDLE
        self._raw_head_bytes = 0
        if not request.keep_alive:
            self._discard_input = True
        self._enqueue(HttpExchange(request, self, Cancellation(self._loop)), self._body_size)

    def _fail(self, rejection: _Rejection) -> None:
        # Raising inside a callback stops the parser; data_received picks the reason up.
        self._rejection = rejection
        raise rejection

    def _head_too_large(self) -> _Rejection:
        limit = self._max_header_bytes
        return _Rejection(431, f"request line and headers exceed {limit} bytes")

    def _body_too_large(self) -> _Rejection:
        limit = self._max_body_bytes
        return _Rejection(
            413,
            f"request body exceeds the limit of {limit} bytes; "
            "start the server with a larger --http-max-input-size to allow it",
        )

    # -- serving exchanges in order ------------------------------------------------------------

    def _busy(self) -> bool:
        return self._current is not None or bool(self._queue)

    def _enqueue(self, item: HttpExchange | _Rejection, size: int = 0) -> None:
        queue = self._queue
        queue.append(item)
        wakeup = self._wakeup
        if wakeup is not None:
            self._wakeup = None
            wakeup.set_result(None)
        elif self._runner is None:
            self._runner = self._loop.create_task(self._serve())
            self._runner.add_done_callback(self._runner_done)
        self._queued_bytes += size
        # Bodies count only while they wait behind another request: one that the runner
        # takes at once must not pause reading for nothing.
        if not self._pipeline_full and (
                len(queue) > self._limits.max_pipeline
                or (self._queued_bytes > self._limits.max_pipeline_bytes and self._busy_ahead())):
            self._pipeline_full = True
            self._update_reading()

    def _busy_ahead(self) -> bool:
        return self._current is not None or len(self._queue) > 1

    async def _serve(self) -> None:
        """The connection's one task: hand each exchange to the app, strictly in turn."""
        queue = self._queue
        while not self._lost:
            if not queue:
                self._wakeup = self._loop.create_future()
                await self._wakeup
                continue
            if self._writable is not None:
                # The peer is not reading its responses: produce no more until it catches up.
                await self.wait_writable()
                continue
            exchange = queue.popleft()
            if isinstance(exchange, _Rejection):
                self._send_rejection(exchange)
                return
            self._queued_bytes -= len(exchange.request.body)
            if self._pipeline_full and not queue:
                self._pipeline_full = False
                self._update_reading()
            self._current = exchange
            await self._run_app(exchange)
            self._current = None
            if not queue:
                self.pacing.waiting_since = self._connections.now
                if self._continue_wanted:
                    self._send_continue()

    async def _run_app(self, exchange: HttpExchange) -> None:
        try:
            await self._app(exchange)
        except Exception:
            logger.exception("HTTP app failed on %s %s", exchange.request.method,
                             exchange.request.path)
            self._abort(exchange, "internal server error")
        except asyncio.CancelledError:
            self.close()
            raise
        else:
            if not exchange.responded and not exchange.disconnected:
                logger.error("HTTP app returned without finishing a response to %s %s",
                             exchange.request.method, exchange.request.path)
                self._abort(exchange, "the server did not produce a response")

    def _abort(self, exchange: HttpExchange, message: str) -> None:
        """Answer 500 if nothing was sent yet, then close: the exchange went wrong."""
        self.closing = True
        exchange.respond_internal_error(message)
        self.close()

    def _runner_done(self, task: asyncio.Task[None]) -> None:
        self._current = None
        self._runner = None
        self._maybe_finish()

    def _maybe_finish(self) -> None:
        if self._finished or not self._lost:
            return
        if self._runner is not None:
            return  # the app still works on a departed exchange; it learnt via its callback
        self._finished = True
        self._connections.discard(self)

    async def wait_writable(self) -> None:
        waiter = self._writable
        if waiter is not None:
            await asyncio.shield(waiter)

    def _update_reading(self) -> None:
        paused = self._pipeline_full or self._writable is not None
        if paused is not self._reading_paused and not self._lost:
            self._reading_paused = paused
            if paused:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    # -- closing ----------------------------------------------------------------------------

    def _peer_left(self) -> None:
        self._discard_input = True
        self._queue.clear()  # exchanges never handed to the app simply vanish
        self._queued_bytes = 0
        if self._current is not None:
            self._current.peer_left()
        if self._wakeup is not None:
            self._release(self._wakeup)
            self._wakeup = None

    def close(self) -> None:
        """Serve nothing more; close once what is already written has been sent."""
        self._discard_input = True
        self._queue.clear()
        self._queued_bytes = 0
        self.transport.close()

    def _reject(self, rejection: _Rejection) -> None:
        """Answer a request the transport refuses, after any response ahead of it, and close."""
        if self._discard_input:
            return
        self._discard_input = True
        if self._busy():
            self._enqueue(rejection)
        else:
            self._send_rejection(rejection)

    def _send_rejection(self, rejection: _Rejection) -> None:
        self.transport.write(encode_error(rejection.status, rejection.message))
        if self.transport.can_write_eof():
            # Half-close and keep draining: closing with unread input would reset the
            # connection, and the reset could destroy the answer before the peer reads it.
            self.transport.write_eof()
            self.pacing.linger(self._connections.now)
        else:
            self.close()

    def _send_continue(self) -> None:
        # An interim response may not cut into a response still being written.
        if self._busy():
            self._continue_wanted = True
        else:
            self._continue_wanted = False
            self.transport.write(_CONTINUE)

    def check_timeouts(self, now: float) -> None:
        """Enforce the waits of HttpLimits on whoever is keeping the other side waiting."""
        if self._lost:
            return
        pacing = self.pacing
        if pacing.lingered_out(now) or (
                self._writable is not None
                and pacing.send_stalled(now, self.transport.get_write_buffer_size())):
            self.transport.abort()
        elif not (self._discard_input or self._reading_paused or self._busy()):
            self._check_peer(now)

    def _check_peer(self, now: float) -> None:
        pacing = self.pacing
        if self._phase is _Phase.IDLE:
            if pacing.idle_too_long(now):
                self.close()  # silently: nobody is waiting for anything
        elif self._phase is _Phase.HEAD:
            if pacing.head_too_slow(now, self._head_started):
                self._reject(_Rejection(408, "timed out reading the request head"))
        else:
            late = pacing.body_too_slow(now, self._body_size)
            if late is not None:
                self._reject(_Rejection(408, late))

    def close_if_idle(self) -> None:
        """Close the connection if no request is being served, queued or received."""
        if self._lost or self._busy():
            return
        if self._phase is _Phase.IDLE or self._discard_input:  # idle, or done with input
            self.close()

    @property
    def reading_paused(self) -> bool:
        return self._reading_paused

    @staticmethod
    def _release(waiter: asyncio.Future[None] | None) -> None:
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


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
