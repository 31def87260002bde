"""One gRPC-over-HTTP/2 connection, sans-IO: bytes in through ``receive``, frames out to one
buffer flushed once per read (or at once when a handler writes between reads).

A call's state changes only by events of the table in ``call_state`` (``Call.move``).
``move`` here is where an event's side effects are applied: trailers, RST_STREAM, timers,
the call's cancellation, the byte budget, bookkeeping. A call that ends early cancels its
``Cancellation`` with the reason; nothing cancels a task for it. The usual unary call makes
two events of its own, each one step with only the side effects it can have: its request
arriving whole with END_STREAM, and its reply going out whole with its end (REPLIED).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from tritium.core.cancellation import CancelReason
from tritium.core.inflight import InFlight
from tritium.frontends.grpc import serving
from tritium.frontends.grpc.call import CALL_BROKEN, Call, GrpcLimits, Router
from tritium.frontends.grpc.call_state import (
    CLIENT_DONE,
    DECIDED,
    CallEvent,
    CallState,
    IllegalMove,
)
from tritium.frontends.grpc.control import Control
from tritium.frontends.grpc.flood import FloodGuard
from tritium.frontends.grpc.frames import FrameReader, NotHttp2, http1_refusal
from tritium.frontends.grpc.http2 import (
    Chunk,
    FrameType,
    H2Error,
    ProtocolViolation,
    goaway,
    rst_stream,
)
from tritium.frontends.grpc.inbound import Inbound
from tritium.frontends.grpc.messages import MessageTooLarge
from tritium.frontends.grpc.sending import Outbox, Output
from tritium.frontends.grpc.status import GrpcStatus
from tritium.frontends.grpc.streams import Streams
from tritium.frontends.grpc.windows import ByteBudget
from tritium.frontends.grpc.wire import (
    OK_TRAILERS,
    message_of,
    trailers_block,
)

log = logging.getLogger("tritium.grpc")


class GrpcConnection:
    """Frames are handled as they arrive; a unary call is dispatched when its request is
    whole, a streaming call as soon as its headers are in."""

    def __init__(self, router: Router, limits: GrpcLimits, output: Output, *,
                 budget: ByteBudget, calls: InFlight[Call]):
        self.limits = limits
        self._output = output
        self._all_calls = calls  # the server's, for its drain
        self.loop = asyncio.get_running_loop()
        # The loop's clock, as its own bound method: reading it costs no Python call.
        self.now: Callable[[], float] = self.loop.time
        now = self.loop.time()
        self.opened_at = self.idle_since = now
        self.calls: dict[int, Call] = {}
        self.control = Control(self)
        self.outbox = Outbox(self.control.send_window, self._flushed)
        self.inbound = Inbound(self, budget)
        self.flood = FloodGuard(limits.flood, now)
        self.streams = Streams(self, router)
        self.reading = False  # a read is being handled: it flushes when it is done
        self.closed = False
        self._close_after_flush = False  # a drain is over: close once the last bytes are out
        self.write_paused = False
        self._writable: asyncio.Future[None] | None = None
        control = self.control
        self._reader = FrameReader(limits.max_frame_bytes, limits.max_header_list_bytes, {
            FrameType.DATA: self.inbound.on_data,
            FrameType.HEADERS: self.streams.on_headers,
            FrameType.PRIORITY: control.on_priority,
            FrameType.RST_STREAM: self.streams.on_rst_stream,
            FrameType.SETTINGS: control.on_settings,
            FrameType.PUSH_PROMISE: control.on_push_promise,
            FrameType.PING: control.on_ping,
            FrameType.GOAWAY: control.on_goaway,
            FrameType.WINDOW_UPDATE: control.on_window_update,
        }, on_preface=control.open)

    # -- bytes in --------------------------------------------------------------------------
    def receive(self, data: bytes) -> None:
        self.reading = True
        try:
            self._reader.feed(data)  # each frame to its handler; none after a close
        except NotHttp2 as exc:
            self._reject_non_http2(exc.start)
            return
        except ProtocolViolation as exc:
            self._fail(exc.code, str(exc))
            return
        finally:
            self.reading = False
        self.flush()

    def lost(self) -> None:
        """The connection is gone: every call on it ends for its client."""
        self.closed = True
        for call in list(self.calls.values()):
            self.move(call, CallEvent.LOST, reason=CancelReason.CLIENT_DISCONNECTED)
        self.inbound.close()
        self._reader.clear()
        self.wake_writers()

    def set_write_paused(self, paused: bool) -> None:
        """The socket's buffer passed its high-water mark (or drained): read nothing more
        from a peer that is not reading what it asked for."""
        self.write_paused = paused
        if paused:
            self._output.pause_reading()
        else:
            self._output.resume_reading()
            self.wake_writers()

    # -- bytes out -------------------------------------------------------------------------
    def flush(self) -> None:
        out = self.outbox.out
        if out:  # most reads of a unary call need no answer of their own
            self.outbox.out = []
            if not self.closed:
                self._output.write(out)
        if self._close_after_flush and not self.closed:
            self._close()

    def flush_soon(self) -> None:
        """Write now unless a read is being handled (that one flushes when it is done)."""
        if not self.reading:
            self.flush()

    def send(self, call: Call, data: bytes | memoryview) -> None:
        if call.state in DECIDED or self.closed:
            return
        self.outbox.data(call, data)
        self.flood.data_sent()
        self.flush_soon()

    def answer(self, call: Call, pieces: list[Chunk], size: int) -> None:
        """A unary call's reply, one message of ``size`` bytes serialized in ``pieces``, and
        its OK end. The usual reply (the request is whole, nothing was sent yet, the message
        fits one frame and the windows) goes out and closes the call in one step, with the
        frames and bookkeeping of ``outbox.data`` and ``finish`` (a unit test runs both)."""
        if call.state is not CallState.HALF_CLOSED or \
                not self.outbox.whole_reply(call, pieces, size):
            self.outbox.data(call, message_of(pieces, size))
            self.flood.data_sent()
            self.finish(call, GrpcStatus.OK)
            return
        self.flood.data_sent()
        call.move(CallEvent.REPLIED)  # END, then FLUSHED: nothing waits for window
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None
        self._forget(call)
        if not self.reading:  # flush_soon, inlined
            self.flush()

    def finish(self, call: Call, status: GrpcStatus, message: str = "",
               reason: CancelReason | None = None) -> None:
        """End ``call`` from this side with ``status``. An end its handler did not ask for
        (``reason``: deadline, shutdown, unreadable input) cancels its request and drops what
        is still queued; a handler's late answer after this is dropped."""
        if call.state in DECIDED:
            return
        # The usual end, without building its block (trailers_block's own first case).
        trailers = OK_TRAILERS if status == 0 and not message and call.headers_sent else \
            trailers_block(status, message, call.headers_sent)
        self.move(call, CallEvent.END, reason=reason, trailers=trailers)
        if not self.reading:  # flush_soon, inlined
            self.flush()

    def stream_error(self, call: Call, code: H2Error) -> None:
        """The peer broke the protocol on this stream only: reset it, keep the connection."""
        self.outbox.out.append(rst_stream(call.stream_id, code))
        self.move(call, CallEvent.RESET, reason=CALL_BROKEN)
        self.count_reset()

    def count_reset(self) -> None:
        if not self.flood.allow_reset(self.loop.time()):
            raise ProtocolViolation(H2Error.ENHANCE_YOUR_CALM, "too many streams reset")

    # -- the one transition ---------------------------------------------------------------
    def move(self, call: Call, event: CallEvent, *, reason: CancelReason | None = None,
              trailers: bytes = b"") -> None:
        before = call.state
        state = call.move(event)  # raises IllegalMove
        if reason is not None:
            call.cancellation.cancel(reason)
        if call.timer is not None and state >= CallState.ENDING:
            call.timer.cancel()
            call.timer = None
        if event is CallEvent.END:
            if reason is not None:
                self.outbox.drop(call)  # nobody asked for the rest of the reply
            call.headers_sent = True
            if call.waiter is not None:
                call.wake()
            self.outbox.trailers(call, trailers)  # FLUSHED follows once the queue is out
            return
        if state is not CallState.CLOSED:
            return
        if event is CallEvent.FLUSHED and before not in CLIENT_DONE and not self.closed:
            # RFC 9113 §8.1: a complete response may be followed by RST_STREAM(NO_ERROR) so
            # the client stops sending a request nobody reads.
            self.outbox.out.append(rst_stream(call.stream_id, H2Error.NO_ERROR))
        self._forget(call)

    def add_call(self, call: Call) -> None:
        self.calls[call.stream_id] = call
        self._all_calls.add(call)
        call.last_progress = self.loop.time()

    def _forget(self, call: Call) -> None:
        """``call`` is CLOSED: nothing of it is kept, and whoever waits on it is woken."""
        self.outbox.drop(call)
        self.inbound.release(call)
        del self.calls[call.stream_id]
        self._all_calls.discard(call)
        if call.waiter is not None:
            call.wake()
        self.wake_writers()
        if not self.calls:
            self.idle_since = self.loop.time()
            if self.streams.refusing:
                self._close_after_flush = True
                self.flush_soon()

    def _flushed(self, call: Call) -> None:
        self.move(call, CallEvent.FLUSHED)

    def remote_closed(self, call: Call) -> None:
        """The client sent END_STREAM on ``call``."""
        try:
            self.move(call, CallEvent.END_STREAM)
        except IllegalMove:
            self.stream_error(call, H2Error.STREAM_CLOSED)
            return
        if call.state is CallState.HALF_CLOSED:
            if call.rpc.unary is not None:
                serving.dispatch_unary(self, call)
            else:
                call.wake()

    def unary_request(self, call: Call, body: memoryview) -> None:
        """A unary call's one message (uncompressed) came whole in the DATA frame that ended
        its stream: ``remote_closed`` and ``dispatch_unary`` in one step (the move cannot be
        illegal, the call was OPEN)."""
        call.move(CallEvent.END_STREAM)
        call.task = self.loop.create_task(serving.serve_unary(self, call, body, False))

    def is_idle_stream(self, stream_id: int) -> bool:
        return stream_id > self.streams.last


    # -- serving -------------------------------------------------------------------------
    async def take_message(self, call: Call) -> Any:
        """The next whole request message of a streaming call, parsed."""
        message = self.inbound.take(call)
        return await serving.read_message(self, call, message.body, message.compressed)

    def message_too_large(self, call: Call, exc: MessageTooLarge) -> None:
        self.finish(call, GrpcStatus.RESOURCE_EXHAUSTED, str(exc), CALL_BROKEN)

    # -- writers waiting for room ----------------------------------------------------------
    async def wait_writable(self) -> None:
        if self._writable is None or self._writable.done():
            self._writable = self.loop.create_future()
        await self._writable

    def wake_writers(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    # -- the connection as a whole -------------------------------------------------------
    def check_timeouts(self, now: float) -> None:
        """Called about once a second: close what a peer left hanging."""
        limits = self.limits
        if not self._reader.preface_seen:
            if now - self.opened_at > limits.preface_timeout_s:
                self._output.close()
            return
        if not self.calls and now - self.idle_since > limits.idle_timeout_s:
            log.debug("closing a gRPC connection idle for %.0f s", now - self.idle_since)
            self.go_away()
            return
        for call in list(self.calls.values()):
            # Bytes held for the client to finish: a message half in, or a unary request
            # never half-closed (a stream's whole messages wait for its handler instead).
            waiting = call.reader.partial or (call.rpc.unary is not None and call.messages)
            if waiting and call.state is CallState.OPEN and \
                    now - call.last_progress > limits.message_progress_timeout_s:
                starved = self.inbound.starved  # then the budget, not the client, is why
                self.finish(call, GrpcStatus.RESOURCE_EXHAUSTED if starved else
                            GrpcStatus.CANCELLED, "the server's request buffer is full"
                            if starved else "request message stopped arriving", CALL_BROKEN)

    def go_away(self) -> None:
        """Refuse new streams; close once the calls in flight have finished."""
        if self.closed or self.streams.refusing:
            return
        if not self._reader.preface_seen:  # not an HTTP/2 connection yet: nothing to say
            self._output.close()
            return
        self.streams.refusing = True
        self.outbox.out.append(goaway(self.streams.last, H2Error.NO_ERROR))
        self._close_after_flush = not self.calls
        self.flush_soon()

    def shut_down(self, status: GrpcStatus, message: str) -> None:
        """End every call still running with ``status`` and close."""
        for call in list(self.calls.values()):
            self.finish(call, status, message, CancelReason.SHUTDOWN)
        self.flush()
        self._output.close()

    def _fail(self, code: H2Error, message: str) -> None:
        log.info("closing a gRPC connection: %s", message)
        self.outbox.out.append(goaway(self.streams.last, code, message))
        self.flush()
        self._close()

    def _reject_non_http2(self, start: bytes) -> None:
        answer = http1_refusal(start)
        if answer:
            self._output.write([answer])
        self._close()

    def _close(self) -> None:
        self.closed = True
        self._reader.stop()  # the frames after this one in the read are not handled
        self._output.close()
