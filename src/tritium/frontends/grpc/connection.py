"""One gRPC-over-HTTP/2 connection, sans-IO: bytes in through ``receive``, frames out to one
buffer flushed once per read (or at once when a handler writes between reads).

A call's state changes only by the events of the table in ``call_state``. ``_move`` makes a
move (``Call.move``) and applies its side effects: trailers, RST_STREAM, timers, the call's
cancellation, the byte budget, bookkeeping. A call that ends early cancels its
``Cancellation`` with the reason; nothing cancels a task for it. The usual unary call has
two events of its own, each one step with the only side effects it can have, looked up in
the same table without a call: END_STREAM with its whole request (``unary_request``), and
REPLIED, its whole reply and end at once (``answer``). Unit tests compare both ways.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

from tritium.core.cancellation import Cancellation, CancelReason
from tritium.core.inflight import InFlight
from tritium.frontends.grpc import serving
from tritium.frontends.grpc.call import CALL_BROKEN, Call, GrpcLimits, Router
from tritium.frontends.grpc.call_state import (
    BY_EVENT,
    CLIENT_DONE,
    CLOSED,
    DECIDED,
    HALF_CLOSED,
    CallEvent,
    CallState,
    IllegalMove,
)
from tritium.frontends.grpc.control import Control
from tritium.frontends.grpc.flood import FloodGuard
from tritium.frontends.grpc.frames import FrameReader, NotHttp2
from tritium.frontends.grpc.headers import HeaderDecoder, MalformedHeaders
from tritium.frontends.grpc.http2 import (
    END_STREAM,
    Chunk,
    FrameType,
    H2Error,
    ProtocolViolation,
    header_block,
    rst_stream,
)
from tritium.frontends.grpc.inbound import Inbound
from tritium.frontends.grpc.lifecycle import ConnectionLife
from tritium.frontends.grpc.messages import MessageTooLarge
from tritium.frontends.grpc.sending import Outbox, Output
from tritium.frontends.grpc.status import GrpcStatus
from tritium.frontends.grpc.windows import ByteBudget
from tritium.frontends.grpc.wire import (
    ENCODINGS,
    OK_TRAILERS,
    message_of,
    parse_timeout,
    trailers_block,
)

# A client's own deadline resets the stream a little before this side's copy of it runs out
# (that one started counting only when the headers arrived).
DEADLINE_SLACK_S = 0.1


# The usual unary call's events, each the table's moves for it, for its hot paths.
_REPLIED, _END_STREAM = BY_EVENT[CallEvent.REPLIED], BY_EVENT[CallEvent.END_STREAM]


class GrpcConnection(ConnectionLife):
    """Frames are handled as they arrive; a unary call is dispatched when its request is
    whole, a streaming call as soon as its headers are in."""

    def __init__(self, router: Router, limits: GrpcLimits, output: Output, *,
                 budget: ByteBudget, calls: InFlight[Call]):
        self._router = router
        self.limits = limits
        self._output = output
        self._all_calls = calls  # the server's, for its drain
        self._loop = asyncio.get_running_loop()
        # The loop's clock, as its own bound method: reading it costs no Python call.
        self.now: Callable[[], float] = self._loop.time
        now = self._loop.time()
        self.opened_at = self.idle_since = now
        self._max_age = _jittered(limits.max_connection_age_s)
        self._aged_at: float | None = None  # when the GOAWAY for age went out
        self._headers = HeaderDecoder(limits.max_header_list_bytes)
        self.calls: dict[int, Call] = {}
        self.last_stream = 0  # the highest stream the peer opened: those above it are idle
        self._max_streams = limits.max_concurrent_streams
        self.control = Control(self)
        self.outbox = Outbox(self.control.send_window, self._flushed)
        self.inbound = Inbound(self, budget)
        self.flood = FloodGuard(limits.flood, now)
        self.reading = False  # a read is being handled: it flushes when it is done
        self.closed = False
        self._going_away = False  # the final GOAWAY went out (lifecycle.py)
        self._leaving_since: float | None = None  # when the first GOAWAY went out
        # The server is leaving (its lame duck): a connection opened now is asked to leave
        # once its first call has begun. Not before: a gRPC client that reads a GOAWAY
        # before it has started a call takes the connection for a failed one.
        self.leave_after_a_call = False
        self.settled: Callable[[], None] = _nothing  # told when the final GOAWAY goes out
        # The server admits nothing any more: a new stream is refused as never processed
        # (REFUSED_STREAM), which clients and proxies may retry elsewhere, unlike an
        # UNAVAILABLE status after the call has begun.
        self.refusing_calls = False
        self._close_after_flush = False  # a drain is over: close once the last bytes are out
        self.write_paused = False
        self._writable: asyncio.Future[None] | None = None
        control = self.control
        self._reader = FrameReader(limits.max_frame_bytes, limits.max_header_list_bytes, {
            FrameType.DATA: self.inbound.on_data,
            FrameType.HEADERS: self._on_headers,
            FrameType.PRIORITY: control.on_priority,
            FrameType.RST_STREAM: self._on_rst_stream,
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
            self._move(call, CallEvent.LOST, reason=CancelReason.CLIENT_DISCONNECTED)
        self.inbound.close()
        self._reader.clear()
        self.wake_writers()

    @property
    def going_away(self) -> bool:
        """A graceful GOAWAY was sent: the calls in flight finish, then the connection closes."""
        return self._going_away or self._leaving_since is not None

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
        if call.state is not HALF_CLOSED or \
                not self.outbox.whole_reply(call, pieces, size):
            self.outbox.data(call, message_of(pieces, size))
            self.flood.data_sent()
            self.finish(call, GrpcStatus.OK)
            return
        self.flood.data_sent()
        call.state = _REPLIED[call.state]  # END, then FLUSHED: nothing waits
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
        self._move(call, CallEvent.END, reason=reason, trailers=trailers)
        if not self.reading:  # flush_soon, inlined
            self.flush()

    def stream_error(self, call: Call, code: H2Error) -> None:
        """The peer broke the protocol on this stream only: reset it, keep the connection."""
        self.outbox.out.append(rst_stream(call.stream_id, code))
        self._move(call, CallEvent.RESET, reason=CALL_BROKEN)
        self.count_reset()

    def count_reset(self) -> None:
        if not self.flood.allow_reset(self._loop.time()):
            raise ProtocolViolation(H2Error.ENHANCE_YOUR_CALM, "too many streams reset")

    # -- the one transition ---------------------------------------------------------------
    def _move(self, call: Call, event: CallEvent, *, reason: CancelReason | None = None,
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
        if state is not CLOSED:
            return
        if event is CallEvent.FLUSHED and before not in CLIENT_DONE and not self.closed:
            # RFC 9113 §8.1: a complete response may be followed by RST_STREAM(NO_ERROR) so
            # the client stops sending a request nobody reads.
            self.outbox.out.append(rst_stream(call.stream_id, H2Error.NO_ERROR))
        self._forget(call)

    def _forget(self, call: Call) -> None:
        """``call`` is CLOSED: nothing of it is kept, and whoever waits on it is woken."""
        if call.pending or call.trailers is not None:  # most calls have nothing queued
            self.outbox.drop(call)
        self.inbound.release(call)
        del self.calls[call.stream_id]
        self._all_calls.discard(call)
        if call.waiter is not None:
            call.wake()
        if self._writable is not None:  # most connections have never had a writer wait
            self.wake_writers()
        if not self.calls:
            self.idle_since = self._loop.time()
            if self._going_away:
                self._close_after_flush = True
                self.flush_soon()

    def _flushed(self, call: Call) -> None:
        self._move(call, CallEvent.FLUSHED)

    def remote_closed(self, call: Call) -> None:
        """The client sent END_STREAM on ``call``."""
        try:
            self._move(call, CallEvent.END_STREAM)
        except IllegalMove:
            self.stream_error(call, H2Error.STREAM_CLOSED)
            return
        if call.state is HALF_CLOSED:
            if call.rpc.unary is not None:
                serving.dispatch_unary(self, call)
            else:
                call.wake()

    def unary_request(self, call: Call, body: memoryview) -> None:
        """A unary call's one message (uncompressed) came whole in the DATA frame that ended
        its stream: ``remote_closed`` and ``dispatch_unary`` in one step (the move cannot be
        illegal, the call was OPEN)."""
        call.state = _END_STREAM[call.state]
        call.task = self._loop.create_task(serving.serve_unary(self, call, body, False))

    # -- inbound frames ------------------------------------------------------------------
    def _on_headers(self, flags: int, stream_id: int, block: memoryview) -> None:
        try:
            headers: dict[str, str] | None = self._headers.decode(bytes(block))
        except MalformedHeaders:
            headers = None  # a stream error, once the stream is known
        call = self.calls.get(stream_id)
        ended = bool(flags & END_STREAM)
        if call is not None:  # trailers from the client: only their END_STREAM matters
            if ended and headers is not None:
                self.remote_closed(call)
            else:
                self.stream_error(call, H2Error.PROTOCOL_ERROR)
            return
        if not stream_id & 1:
            raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "even stream id from client")
        if stream_id <= self.last_stream:
            if ended:
                return  # late trailers of a call this side already finished
            raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "stream id went backwards")
        self.last_stream = stream_id
        if (headers is None or self._going_away or self.refusing_calls
                or len(self.calls) >= self._max_streams):
            code = H2Error.PROTOCOL_ERROR if headers is None else H2Error.REFUSED_STREAM
            self.outbox.out.append(rst_stream(stream_id, code))
            self.count_reset()
            return
        self._start_call(stream_id, headers, ended)
        if self.leave_after_a_call:
            self.go_away()

    def _start_call(self, stream_id: int, headers: dict[str, str], ended: bool) -> None:
        path = headers.get(":path", "")
        content_type = headers.get("content-type", "")
        if headers.get(":method") != "POST" or not content_type.startswith("application/grpc"):
            block = header_block((b":status", b"415"), (b"content-type", b"text/plain"))
            self.outbox.answer_only(stream_id, ended, block)
            return
        rpc = self._router.get(path)
        encoding = headers.get("grpc-encoding", "identity")
        if rpc is None or encoding not in ENCODINGS:
            message = f"unknown method {path}" if rpc is None else \
                f"unsupported grpc-encoding '{encoding}'"
            self.outbox.answer_only(stream_id, ended, trailers_block(
                GrpcStatus.UNIMPLEMENTED, message, headers_sent=False))
            return
        call = Call(self, stream_id, rpc, encoding, headers, self.control.peer_initial_window,
                    self.limits.stream_window, self.inbound.message_limit,
                    Cancellation(self._loop))
        self.calls[stream_id] = call
        self._all_calls.add(call)
        call.last_progress = now = self._loop.time()
        timeout = headers.get("grpc-timeout")
        if timeout is not None:
            try:
                seconds = parse_timeout(timeout)
            except ValueError as exc:
                self.finish(call, GrpcStatus.INVALID_ARGUMENT, str(exc))
                return
            call.deadline = now + seconds
            call.timer = self._loop.call_at(call.deadline, self._expire, call)
        if rpc.stream is not None:
            call.task = self._loop.create_task(serving.serve_stream(self, call))
        if ended:
            self.remote_closed(call)

    def _on_rst_stream(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise ProtocolViolation(H2Error.FRAME_SIZE_ERROR, "RST_STREAM is not 4 bytes")
        if stream_id == 0 or stream_id > self.last_stream:
            raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "RST_STREAM on an idle stream")
        self.count_reset()
        call = self.calls.get(stream_id)
        if call is not None:
            self._move(call, CallEvent.RESET, reason=self._reason_for_reset(call))

    def _reason_for_reset(self, call: Call) -> CancelReason:
        if call.deadline is not None and call.deadline - self._loop.time() <= DEADLINE_SLACK_S:
            return CancelReason.DEADLINE
        return CancelReason.CLIENT_CANCELLED

    def _expire(self, call: Call) -> None:
        call.timer = None
        self.finish(call, GrpcStatus.DEADLINE_EXCEEDED, "Deadline Exceeded", CancelReason.DEADLINE)

    # -- serving -------------------------------------------------------------------------
    async def take_message(self, call: Call) -> Any:
        """The next whole request message of a streaming call, parsed."""
        message = self.inbound.take(call)
        return await serving.read_message(self, call, message.body, message.compressed)

    def message_too_large(self, call: Call, exc: MessageTooLarge) -> None:
        self.finish(call, GrpcStatus.RESOURCE_EXHAUSTED, str(exc), CALL_BROKEN)


def _jittered(age_s: float | None) -> float | None:
    return None if age_s is None else age_s * random.uniform(0.9, 1.1)


def _nothing() -> None:
    """What a connection outside a server (a unit test's) tells when it settles."""
