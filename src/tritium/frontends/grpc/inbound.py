"""The receive side of a connection: DATA frames to request messages, with honest flow
control and the server's byte budget.

Credit for received bytes goes back to the peer only when the server is not holding them
for nobody: at once for a message still arriving (within the budget), and for a whole
message when its handler takes it. A peer sending faster than its handler reads, or into a
spent budget, stalls on its own windows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tritium.frontends.grpc.call import Call
from tritium.frontends.grpc.call_state import CLIENT_DONE, DECIDED, CallState
from tritium.frontends.grpc.frames import Frame
from tritium.frontends.grpc.http2 import (
    END_STREAM,
    H2Error,
    ProtocolViolation,
    strip_padding,
    window_update,
)
from tritium.frontends.grpc.messages import Message, MessageTooLarge
from tritium.frontends.grpc.windows import ByteBudget, RecvWindow, WindowError

if TYPE_CHECKING:
    from tritium.frontends.grpc.connection import GrpcConnection


class Inbound:
    def __init__(self, conn: GrpcConnection, budget: ByteBudget):
        self._conn = conn
        limits = conn.limits
        self.window = RecvWindow(limits.connection_window)
        self._budget = budget
        self._limit = limits.max_connection_buffered_bytes
        self.reserved = 0  # this connection's part of the budget
        # No message can be larger than what the server may hold of it.
        self.message_limit = min(limits.max_message_bytes, self._limit, budget.limit)

    def on_data(self, found: Frame) -> None:
        conn = self._conn
        stream_id, payload = found.stream_id, found.payload
        size = len(payload)
        try:
            self.window.receive(size)
        except WindowError as exc:
            raise ProtocolViolation(H2Error.FLOW_CONTROL_ERROR, str(exc)) from None
        call = conn.calls.get(stream_id)
        if call is None:
            if stream_id == 0 or conn.is_idle_stream(stream_id):
                raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "DATA on an idle stream")
            self._credit(None, size)  # a stream already closed: bytes nobody reads
            return
        if call.state in CLIENT_DONE:
            self._credit(None, size)
            conn.stream_error(call, H2Error.STREAM_CLOSED)
            return
        try:
            call.recv_window.receive(size)
        except WindowError:
            self._credit(None, size)
            conn.stream_error(call, H2Error.FLOW_CONTROL_ERROR)
            return
        ended = found.flags & END_STREAM
        if not size and not ended and not conn.flood.allow_empty_frame(conn.now()):
            raise ProtocolViolation(H2Error.ENHANCE_YOUR_CALM, "too many empty DATA frames")
        data = strip_padding(payload, found.flags)
        self._credit(call, size - len(data))  # padding is never held
        if data:
            self._take_bytes(call, data)
        if ended and call.state is not CallState.CLOSED:
            conn.remote_closed(call)

    def _take_bytes(self, call: Call, data: memoryview) -> None:
        if call.state in DECIDED:
            self._credit(call, len(data))
            return
        try:
            messages = call.reader.feed(data)
        except MessageTooLarge as exc:
            self._credit(call, len(data))
            self._conn.message_too_large(call, exc)
            return
        call.withheld += len(data)
        call.last_progress = self._conn.now()
        if messages:
            call.messages.extend(messages)
            if call.rpc.stream is not None:
                call.wake()
        self._settle(call)

    def take(self, call: Call) -> Message:
        """The handler takes the call's oldest whole message: its bytes are no longer held."""
        message = call.messages.popleft()
        size = len(message.body) + 5
        reserved = min(size, call.reserved)
        if reserved:
            call.reserved -= reserved
            self.reserved -= reserved
            self._budget.release(reserved)
        withheld = size - reserved
        call.withheld -= withheld
        self._credit(call, withheld)
        self._settle(call)
        self._conn.flush_soon()
        return message

    def release(self, call: Call) -> None:
        """``call`` is closed: its bytes are dropped and their credit returned."""
        self._budget.forget(call)
        if call.reserved:
            self.reserved -= call.reserved
            self._budget.release(call.reserved)
            call.reserved = 0
        if call.withheld:
            self._credit(None, call.withheld)
            call.withheld = 0
        call.messages.clear()

    def _settle(self, call: Call) -> None:
        """Return the credit of withheld bytes if nothing holds it back."""
        withheld = call.withheld
        if not withheld or call.state in DECIDED:
            return
        if call.messages and call.rpc.stream is not None:
            return  # the handler's pace sets the peer's: credit comes back on ``take``
        if self.reserved + withheld > self._limit or not self._budget.reserve(withheld):
            self._budget.wait(call, lambda: self._retry(call))
            return
        self.reserved += withheld
        call.reserved += withheld
        call.withheld = 0
        self._credit(call, withheld)

    def _retry(self, call: Call) -> None:
        if self._conn.calls.get(call.stream_id) is call:
            self._settle(call)
            self._conn.flush_soon()

    def _credit(self, call: Call | None, count: int) -> None:
        if not count:
            return
        out = self._conn.outbox.out
        if call is not None and call.state is CallState.OPEN:
            increment = call.recv_window.consume(count)
            if increment:
                out.append(window_update(call.stream_id, increment))
        increment = self.window.consume(count)
        if increment:
            out.append(window_update(0, increment))
