"""The streams a gRPC connection's client opens and resets: HEADERS that start a call (or
end one), RST_STREAM, and the stream ids seen so far."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tritium.core.cancellation import Cancellation, CancelReason
from tritium.frontends.grpc import serving
from tritium.frontends.grpc.call import Call, Router
from tritium.frontends.grpc.call_state import CallEvent
from tritium.frontends.grpc.headers import HeaderDecoder, MalformedHeaders
from tritium.frontends.grpc.http2 import (
    END_STREAM,
    H2Error,
    ProtocolViolation,
    header_block,
    rst_stream,
)
from tritium.frontends.grpc.status import GrpcStatus
from tritium.frontends.grpc.wire import ENCODINGS, parse_timeout, trailers_block

if TYPE_CHECKING:
    from tritium.frontends.grpc.connection import GrpcConnection

# A client's own deadline resets the stream a little before this side's copy of it runs out
# (that one started counting only when the headers arrived).
DEADLINE_SLACK_S = 0.1


class Streams:
    """Opens a call for each new stream the client starts, within the connection's limits,
    and ends calls the client resets."""

    def __init__(self, conn: GrpcConnection, router: Router):
        self._conn = conn
        self._router = router
        self._headers = HeaderDecoder(conn.limits.max_header_list_bytes)
        self._max_streams = conn.limits.max_concurrent_streams
        self.last = 0  # the highest stream id the client has opened
        self.refusing = False  # going away: new streams are refused

    def is_idle(self, stream_id: int) -> bool:
        return stream_id > self.last

    def on_headers(self, flags: int, stream_id: int, block: memoryview) -> None:
        conn = self._conn
        try:
            headers: dict[str, str] | None = self._headers.decode(bytes(block))
        except MalformedHeaders:
            headers = None  # a stream error, once the stream is known
        call = conn.calls.get(stream_id)
        ended = bool(flags & END_STREAM)
        if call is not None:  # trailers from the client: only their END_STREAM matters
            if ended and headers is not None:
                conn.remote_closed(call)
            else:
                conn.stream_error(call, H2Error.PROTOCOL_ERROR)
            return
        if not stream_id & 1:
            raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "even stream id from client")
        if stream_id <= self.last:
            if ended:
                return  # late trailers of a call this side already finished
            raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "stream id went backwards")
        self.last = stream_id
        if headers is None or self.refusing or len(conn.calls) >= self._max_streams:
            code = H2Error.PROTOCOL_ERROR if headers is None else H2Error.REFUSED_STREAM
            conn.outbox.out.append(rst_stream(stream_id, code))
            conn.count_reset()
            return
        self._start_call(stream_id, headers, ended)

    def _start_call(self, stream_id: int, headers: dict[str, str], ended: bool) -> None:
        conn = self._conn
        path = headers.get(":path", "")
        content_type = headers.get("content-type", "")
        if headers.get(":method") != "POST" or not content_type.startswith("application/grpc"):
            block = header_block((b":status", b"415"), (b"content-type", b"text/plain"))
            conn.outbox.answer_only(stream_id, ended, block)
            return
        rpc = self._router.get(path)
        encoding = headers.get("grpc-encoding", "identity")
        if rpc is None or encoding not in ENCODINGS:
            message = f"unknown method {path}" if rpc is None else \
                f"unsupported grpc-encoding '{encoding}'"
            conn.outbox.answer_only(stream_id, ended, trailers_block(
                GrpcStatus.UNIMPLEMENTED, message, headers_sent=False))
            return
        loop = conn.loop
        call = Call(conn, stream_id, rpc, encoding, headers, conn.control.peer_initial_window,
                    conn.limits.stream_window, conn.inbound.message_limit, Cancellation(loop))
        conn.add_call(call)
        timeout = headers.get("grpc-timeout")
        if timeout is not None:
            try:
                seconds = parse_timeout(timeout)
            except ValueError as exc:
                conn.finish(call, GrpcStatus.INVALID_ARGUMENT, str(exc))
                return
            call.deadline = loop.time() + seconds
            call.timer = loop.call_at(call.deadline, self._expire, call)
        if rpc.stream is not None:
            call.task = loop.create_task(serving.serve_stream(conn, call))
        if ended:
            conn.remote_closed(call)

    def on_rst_stream(self, flags: int, stream_id: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise ProtocolViolation(H2Error.FRAME_SIZE_ERROR, "RST_STREAM is not 4 bytes")
        if stream_id == 0 or stream_id > self.last:
            raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "RST_STREAM on an idle stream")
        conn = self._conn
        conn.count_reset()
        call = conn.calls.get(stream_id)
        if call is not None:
            conn.move(call, CallEvent.RESET, reason=self._reason_for_reset(call))

    def _reason_for_reset(self, call: Call) -> CancelReason:
        if call.deadline is not None and \
                call.deadline - self._conn.loop.time() <= DEADLINE_SLACK_S:
            return CancelReason.DEADLINE
        return CancelReason.CLIENT_CANCELLED

    def _expire(self, call: Call) -> None:
        call.timer = None
        self._conn.finish(call, GrpcStatus.DEADLINE_EXCEEDED, "Deadline Exceeded",
                          CancelReason.DEADLINE)
