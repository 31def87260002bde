"""The life of a gRPC connection around its calls: timeouts for what a peer leaves hanging,
GOAWAY, shutdown, closing, and writers waiting for the socket to take more."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from tritium.core.cancellation import CancelReason
from tritium.frontends.grpc.call import CALL_BROKEN, Call, GrpcLimits
from tritium.frontends.grpc.call_state import CallState
from tritium.frontends.grpc.frames import FrameReader, http1_refusal
from tritium.frontends.grpc.http2 import FrameType, H2Error, frame, goaway
from tritium.frontends.grpc.inbound import Inbound
from tritium.frontends.grpc.sending import Outbox, Output
from tritium.frontends.grpc.status import GrpcStatus

log = logging.getLogger("tritium.grpc")

# A graceful GOAWAY comes in two (RFC 9113 §6.8): the first names the highest stream id there
# is and is followed by a PING; a stream the peer opened before it read them (its HEADERS
# crossing ours on the wire) is still taken. The PING's answer, or _PING_ANSWER_S without
# one, brings the final GOAWAY, naming the last stream taken; only streams after that one
# are refused. A one-step GOAWAY refuses the crossing streams, and a proxy (nginx) cannot
# send an already-sent gRPC call elsewhere: its client gets an error.
_ALL_STREAMS = (1 << 31) - 1
_LEAVING_PING = b"leaving!"  # the payload of the PING between the two GOAWAYs (8 bytes)
_PING_ANSWER_S = 2.0


class ConnectionLife:
    """Mixed into GrpcConnection: everything here is off the path of a call's bytes."""

    if TYPE_CHECKING:
        limits: GrpcLimits
        calls: dict[int, Call]
        outbox: Outbox
        inbound: Inbound
        closed: bool
        write_paused: bool
        opened_at: float
        idle_since: float
        _max_age: float | None
        _aged_at: float | None
        _output: Output
        _reader: FrameReader
        _loop: asyncio.AbstractEventLoop
        _writable: asyncio.Future[None] | None
        _going_away: bool
        _leaving_since: float | None
        settled: Callable[[], None]
        _close_after_flush: bool
        last_stream: int

        def flush(self) -> None: ...

        def flush_soon(self) -> None: ...

        def finish(self, call: Call, status: GrpcStatus, message: str = "",
                   reason: CancelReason | None = None) -> None: ...

    def set_write_paused(self, paused: bool) -> None:
        """The socket's buffer passed its high-water mark (or drained): read nothing more
        from a peer that is not reading what it asked for."""
        self.write_paused = paused
        if paused:
            self._output.pause_reading()
        else:
            self._output.resume_reading()
            self.wake_writers()

    # -- writers waiting for room ----------------------------------------------------------
    async def wait_writable(self) -> None:
        if self._writable is None or self._writable.done():
            self._writable = self._loop.create_future()
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
        if self._leaving_since is not None and not self._going_away \
                and now - self._leaving_since > _PING_ANSWER_S:
            self._final_goaway()  # the peer never answered the PING
        if self._max_age is not None and now - self.opened_at > self._max_age:
            self._leave_for_age(now)
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

    def _leave_for_age(self, now: float) -> None:
        """GOAWAY once; the grace counts from it, as in grpc-core."""
        if self._aged_at is None:
            self._aged_at = now
            self.go_away()
        grace = self.limits.max_connection_age_grace_s
        if grace is not None and now - self._aged_at > grace and self.calls \
                and not self.closed:
            self.shut_down(GrpcStatus.UNAVAILABLE, "the connection reached its maximum age")

    def go_away(self) -> None:
        """Ask the peer to leave, gracefully (the first GOAWAY and its PING): the streams it
        opens until the final GOAWAY are still served; after it, new ones are refused, and
        the connection closes once the calls in flight have finished."""
        if self.closed or self._going_away or self._leaving_since is not None:
            return
        if not self._reader.preface_seen:  # not an HTTP/2 connection yet: nothing to say
            self._output.close()
            return
        self._leaving_since = self._loop.time()
        self.outbox.out.append(goaway(_ALL_STREAMS, H2Error.NO_ERROR))
        self.outbox.out.append(frame(FrameType.PING, 0, 0, _LEAVING_PING))
        self.flush_soon()

    @property
    def http2(self) -> bool:
        """The peer's preface has arrived: frames can be sent to it."""
        return self._reader.preface_seen

    @property
    def may_open_streams(self) -> bool:
        """The peer may still open a stream it expects served: the final GOAWAY has not
        gone out."""
        return not self.closed and not self._going_away

    def ping_answered(self, payload: bytes) -> None:
        """The peer acknowledged a PING of ours: the one after the first GOAWAY means it has
        read that GOAWAY and opens nothing more."""
        if payload == _LEAVING_PING and self._leaving_since is not None:
            self._final_goaway()

    def _final_goaway(self) -> None:
        if self.closed or self._going_away:
            return
        self._going_away = True
        self.settled()
        self.outbox.out.append(goaway(self.last_stream, H2Error.NO_ERROR))
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
        self.outbox.out.append(goaway(self.last_stream, code, message))
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
