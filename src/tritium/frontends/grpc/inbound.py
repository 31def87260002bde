"""The receive side of a connection: DATA frames to request messages, with flow control
that bounds what peers can make the server hold.

Two windows do two jobs. The connection's window is memory: its credit is reserved in the
server's byte budget before it is granted, and stays reserved while the bytes sent against
it are held, so everything held or on its way fits in the budget. A stream's window is pace:
a streaming call whose handler has not taken its queued messages gets no new stream credit,
so its peer stalls on its own window instead of filling the connection's.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from tritium.frontends.grpc.call import NO_READER, Call
from tritium.frontends.grpc.call_state import CLIENT_DONE, CLOSED, DECIDED, OPEN
from tritium.frontends.grpc.http2 import (
    DEFAULT_WINDOW,
    END_STREAM,
    PADDED,
    H2Error,
    ProtocolViolation,
    strip_padding,
    window_update,
)
from tritium.frontends.grpc.messages import Message, MessageReader, MessageTooLarge
from tritium.frontends.grpc.windows import ByteBudget, RecvWindow

if TYPE_CHECKING:
    from tritium.frontends.grpc.connection import GrpcConnection

_FIRST_WINDOW = 1024 * 1024
_MESSAGE_PREFIX = struct.Struct(">BI")  # a gRPC message's compressed flag and length


class Inbound:
    def __init__(self, conn: GrpcConnection, budget: ByteBudget):
        self._conn = conn
        limits = conn.limits
        self._target = limits.connection_window
        # The window grows from here towards the target as the peer uses it, so an idle
        # connection holds little of the budget.
        self._size = min(_FIRST_WINDOW, self._target)
        self._limit = limits.max_connection_buffered_bytes
        self._budget = budget
        # ``available`` of this window is the credit the peer holds now.
        self.window = RecvWindow(DEFAULT_WINDOW)
        self._granted_once = False
        self.held = 0  # bytes received and not yet consumed
        self.reserved = DEFAULT_WINDOW  # in the budget: credit outstanding + bytes held
        budget.take(DEFAULT_WINDOW)  # granted by the protocol before we say anything
        # No message can be larger than what the server may hold of it.
        self.message_limit = min(limits.max_message_bytes, self._limit, budget.ceiling)
        self.inflated = 0  # bytes of inflated messages held, counted in ``budget`` too

    def open(self) -> None:
        self._grant()

    def close(self) -> None:
        """The connection is gone: everything it reserved goes back to the budget."""
        self._budget.forget(self)
        self._budget.release(self.reserved + self.inflated)
        self.reserved = self.held = self.inflated = 0

    @property
    def starved(self) -> bool:
        """The peer has no credit because the budget has none to give."""
        return self.window.available <= 0

    def on_data(self, flags: int, stream_id: int, payload: memoryview) -> None:
        conn = self._conn
        size = len(payload)
        window = self.window
        if size > window.available:  # RecvWindow.receive's check, without the call
            raise ProtocolViolation(H2Error.FLOW_CONTROL_ERROR, window.overrun_text(size))
        window.available -= size
        self.held += size
        call = conn.calls.get(stream_id)
        if call is None:
            if stream_id == 0 or stream_id > conn.last_stream:
                raise ProtocolViolation(H2Error.PROTOCOL_ERROR, "DATA on an idle stream")
            self._consume(size)  # a stream already closed: bytes nobody reads
            return
        state = call.state
        if state in CLIENT_DONE:
            self._consume(size)
            conn.stream_error(call, H2Error.STREAM_CLOSED)
            return
        call_window = call.recv_window
        if size > call_window.available:
            self._consume(size)
            conn.stream_error(call, H2Error.FLOW_CONTROL_ERROR)
            return
        call_window.available -= size
        # The usual unary request (``call.held``: no message and no part of one is held).
        if flags == END_STREAM and state is OPEN and not call.held and size >= 5 \
                and call.rpc.unary is not None:
            flag, length = _MESSAGE_PREFIX.unpack_from(payload)
            if not flag and length == size - 5 <= self.message_limit:  # the reader's limit
                self._whole_request(call, payload, size)
                return
        self._on_call_data(call, flags, payload, size)

    def _on_call_data(self, call: Call, flags: int, payload: memoryview, size: int) -> None:
        conn = self._conn
        ended = flags & END_STREAM
        if not size and not ended and not conn.flood.allow_empty_frame(conn.now()):
            raise ProtocolViolation(H2Error.ENHANCE_YOUR_CALM, "too many empty DATA frames")
        if flags & PADDED:
            data = strip_padding(payload, flags)
            self._consume(size - len(data))  # padding is never held
            call.withheld += size - len(data)
        else:
            data = payload
        if data:
            self._take_bytes(call, data)
        if call.withheld and not call.messages:
            self._return_stream_credit(call)
        if self.window.available <= self._size // 2:  # held bytes count; more may come
            self._grant()
        if ended and call.state is not CLOSED:
            conn.remote_closed(call)

    def _whole_request(self, call: Call, payload: memoryview, size: int) -> None:
        """The usual unary request: one whole uncompressed message in the DATA frame that ends
        the stream, nothing before it, no padding. What ``_take_bytes``, ``remote_closed``,
        ``dispatch_unary`` and ``take`` would do with it, in their order, in one step and with
        no ``Message``: the same bookkeeping and frames (a unit test runs both)."""
        # (``call.last_progress`` is left: it counts only while a call is OPEN, and this one
        # is half-closed at once.)
        call.withheld += size
        window = self.window
        if window.available <= self._size // 2:  # the bytes are in...
            self._grant()
        # ...and taken at once (``call.held`` would go up and back down): ``_consume``.
        self.held -= size
        self.reserved -= size
        self._budget.release(size)
        if window.available <= self._size // 2:
            self._grant()
        self._conn.unary_request(call, payload[5:])

    def _take_bytes(self, call: Call, data: memoryview) -> None:
        size = len(data)
        call.withheld += size
        if call.state in DECIDED:
            self._consume(size)
            return
        reader = call.reader
        if reader is NO_READER:
            reader = call.reader = MessageReader(call.max_message)
        try:
            messages = reader.feed(data)
        except MessageTooLarge as exc:
            self._consume(size)
            self._conn.message_too_large(call, exc)
            return
        call.held += size
        call.last_progress = self._conn.now()
        if messages:
            call.messages.extend(messages)
            if call.rpc.stream is not None:
                call.wake()

    def take(self, call: Call) -> Message:
        """The handler takes the call's oldest whole message: its bytes are no longer held."""
        message = call.messages.popleft()
        size = len(message.body) + 5
        call.held -= size
        self._consume(size)
        if call.withheld and call.state is OPEN:  # else there is none to return
            self._return_stream_credit(call)
        if not self._conn.reading:  # flush_soon, inlined
            self._conn.flush()
        return message

    def release(self, call: Call) -> None:
        """``call`` is closed: its bytes are dropped."""
        if call.held:  # its messages, and a message half in (the held bytes count them)
            self._consume(call.held)
            call.messages.clear()
        call.held = call.withheld = 0
        if call.reader is not NO_READER and call.reader.partial:
            call.reader.clear()  # its task may live on a while; the bytes need not

    def _return_stream_credit(self, call: Call) -> None:
        if not call.withheld or call.state is not OPEN:
            return
        if call.messages:
            # A whole message waits for its handler (or, for a unary call, for END_STREAM,
            # which needs no credit): the handler's pace sets the peer's.
            return
        increment = call.recv_window.consume(call.withheld)
        call.withheld = 0
        if increment:
            self._conn.outbox.out.append(window_update(call.stream_id, increment))

    def _consume(self, count: int) -> None:
        if not count:
            return
        self.held -= count
        self.reserved -= count
        self._budget.release(count)
        if self.window.available <= self._size // 2:
            self._grant()

    def _grant(self) -> None:
        """Top the peer's credit back up to the window, as far as the budget allows, once
        it has used half (one WINDOW_UPDATE per half window, not one per message); a peer
        that keeps using its window gets a larger one, up to the target."""
        outstanding = self.window.available
        if outstanding > self._size // 2 or self._conn.closed:
            return
        if self._granted_once:
            self._size = min(self._size * 2, self._target)
        self._granted_once = True
        room = min(self._size - outstanding, self._limit - self.reserved, self._budget.room())
        if room <= 0:
            self._budget.wait(self, self._retry)
            return
        self._budget.take(room)
        self.reserved += room
        self.window.available += room
        self._conn.outbox.out.append(window_update(0, room))

    def hold_inflated(self, count: int) -> bool:
        """Count ``count`` more bytes of a message being inflated as held, if this connection,
        its peer and the server all have room for them."""
        if self._conn.closed or self.reserved + self.inflated + count > self._limit \
                or not self._budget.reserve(count):
            return False
        self.inflated += count
        return True

    def release_inflated(self, count: int) -> None:
        """An inflated message is parsed (or dropped): its bytes are no longer held."""
        count = min(count, self.inflated)  # none, once the connection has closed
        if count:
            self.inflated -= count
            self._budget.release(count)

    def _retry(self) -> None:
        self._grant()
        self._conn.flush_soon()
