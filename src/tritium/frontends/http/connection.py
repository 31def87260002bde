"""One HTTP/1.1 connection: requests served in order, backpressure both ways, the peer's
departure, and the timeouts of both sides."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, cast

from tritium.core.cancellation import Cancellation
from tritium.frontends.http.exchange import App, HttpExchange, HttpRequest, encode_error
from tritium.frontends.http.limits import HttpLimits
from tritium.frontends.http.reading import Phase, Rejection, RequestReader

if TYPE_CHECKING:
    from tritium.frontends.http.transport import OpenConnections

logger = logging.getLogger("tritium.http")

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class HttpConnection(RequestReader):
    """Parses requests as bytes arrive and serves them one at a time, in order, with one task.

    Reading stops only for backpressure: too many requests parsed ahead of the one being
    served, or a peer that does not read its responses (the write buffer passed its high-water
    mark). Otherwise the peer's FIN or RST is seen the moment it arrives. At the TCP level a
    half-close (the client shut down only its sending side) cannot be told apart from a
    close: both are a FIN, so either one counts as the client leaving.
    """

    def __init__(self, app: App, limits: HttpLimits, connections: OpenConnections):
        super().__init__(limits, connections)
        self._app = app
        self._connections = connections
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport  # connection_made sets it before any other call
        self._queue: deque[HttpExchange | Rejection] = deque()
        self._queued_bytes = 0  # request bodies in the queue
        self._current: HttpExchange | None = None
        self._runner: asyncio.Task[None] | None = None
        # Set only while the runner waits for work; whoever resolves it clears it.
        self._wakeup: asyncio.Future[None] | None = None
        # Exists while the transport's write buffer is over its high-water mark.
        self._writable: asyncio.Future[None] | None = None
        self._lost = False
        self._finished = False
        # Counted from the moment it is made, not from connection_made: a burst of accepts
        # (or of TLS handshakes) must not pass the listener's cap together.
        self._connected = False
        connections.add(self)
        self.closing = connections.last_exchanges  # the response being written is the last one
        self._reading_paused = False
        self._continue_wanted = False

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        if self._lost:  # given up on before it connected (see check_timeouts)
            self.transport.abort()
        self._connected = True

    def eof_received(self) -> bool:
        # A FIN, whether from close() or shutdown(SHUT_WR): the client is leaving. Tell the
        # app now rather than when the transport finishes closing.
        self._peer_left()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._peer_left()
        self._stop_reading()
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

    def _received(self, request: HttpRequest, body_size: int) -> None:
        self._continue_wanted = False
        self._enqueue(HttpExchange(request, self, Cancellation(self._loop)), body_size)

    # -- serving exchanges in order ------------------------------------------------------------

    def _busy(self) -> bool:
        return self._current is not None or bool(self._queue)

    def _enqueue(self, item: HttpExchange | Rejection, size: int = 0) -> None:
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
            if isinstance(exchange, Rejection):
                self._send_rejection(exchange)
                return
            self._queued_bytes -= len(exchange.request.body)
            if self._pipeline_full and not queue:
                self._pipeline_drained()
            self._current = exchange
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
            self._current = None
            if not queue:
                self.pacing.waiting_since = self._connections.now
                if self._continue_wanted or self._connections.draining:
                    self._went_idle()

    def _went_idle(self) -> None:
        """The last exchange is answered, none waits, and something was held for this."""
        if self._continue_wanted:
            self._send_continue()
        if self._connections.draining:
            self.close_if_idle()

    def _pipeline_drained(self) -> None:
        self._resume_parsing()
        self._update_reading()

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

    def _reject(self, rejection: Rejection) -> None:
        """Answer a request the transport refuses, after any response ahead of it, and close."""
        if self._discard_input:
            return
        self._discard_input = True
        if self._busy():
            self._enqueue(rejection)
        else:
            self._send_rejection(rejection)

    def _send_rejection(self, rejection: Rejection) -> None:
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
        if not self._connected:
            if pacing.never_connected(now):  # its TLS handshake failed, say
                self._give_up()
        elif self._writable is not None and pacing.send_stalled(
                now, self.transport.get_write_buffer_size()):
            logger.info("closing an HTTP connection whose peer has not read its response for "
                        "%g s (--http-send-timeout-secs)", self._limits.send_timeout_s)
            self.transport.abort()
        elif pacing.lingered_out(now):
            self.transport.abort()
        elif not (self._discard_input or self._reading_paused or self._busy()):
            self._check_peer(now)

    def _check_peer(self, now: float) -> None:
        pacing = self.pacing
        if self._phase is Phase.IDLE:
            if pacing.idle_too_long(now):
                self.close()  # silently: nobody is waiting for anything
        elif self._phase is Phase.HEAD:
            if pacing.head_too_slow(now, self._head_started):
                self._reject(Rejection(408, "timed out reading the request head"))
        else:
            late = pacing.body_too_slow(now, self._body_started, self._body_size)
            if late is not None:
                self._reject(Rejection(408, late))

    def close_if_idle(self) -> None:
        """Close the connection if no request is being served, queued or received."""
        if self._lost or self._busy():
            return
        if not self._connected:
            self._give_up()
        elif self._phase is Phase.IDLE or self._discard_input:  # idle, or done with input
            self.close()

    def _give_up(self) -> None:
        """Stop counting a connection that never got its transport; it is refused if it does."""
        self._lost = True
        self._maybe_finish()

    @property
    def connected(self) -> bool:
        return self._connected

    @property
    def reading_paused(self) -> bool:
        return self._reading_paused

    @property
    def pipelined(self) -> int:
        """Requests parsed and waiting behind the one being served."""
        return len(self._queue)

    @staticmethod
    def _release(waiter: asyncio.Future[None] | None) -> None:
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
