"""A gRPC call as its handler sees it, the method table, and the transport's limits."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from google.protobuf.message import DecodeError

from tritium.core.cancellation import Cancellation, CancelReason
from tritium.frontends.grpc.call_state import CLOSED, MOVES, OPEN, CallEvent, CallState, next_state
from tritium.frontends.grpc.flood import FloodLimits
from tritium.frontends.grpc.messages import Message, MessageReader
from tritium.frontends.grpc.status import GrpcStatus
from tritium.frontends.grpc.windows import RecvWindow, SendWindow
from tritium.frontends.grpc.wire import length_prefixed

if TYPE_CHECKING:
    from tritium.frontends.grpc.connection import GrpcConnection

# A call whose client sent bytes that cannot be read is over: what it started answers nobody.
CALL_BROKEN = CancelReason.CLIENT_CANCELLED

UnaryHandler = Callable[[Any, "Call"], Awaitable[Any]]
StreamHandler = Callable[["Call"], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Rpc:
    """A method: how its request messages are parsed, and the coroutine that serves it.

    A unary handler returns its reply message, or the reply already serialized as a list of
    pieces (bytes or views) that the transport joins behind the message prefix."""

    request_type: Any  # a generated protobuf message class
    unary: UnaryHandler | None = None
    stream: StreamHandler | None = None


Router = dict[str, Rpc]  # by ``:path``, e.g. "/inference.GRPCInferenceService/ModelInfer"


@dataclass(frozen=True, slots=True)
class GrpcLimits:
    # Triton takes messages up to INT32_MAX both ways.
    max_message_bytes: int = 2**31 - 1
    max_header_list_bytes: int = 64 * 1024
    max_concurrent_streams: int = 4096
    # Credit a stream and the connection are granted at most. A connection's comes out of
    # the byte budget, so the connection window times the connections that fill it is what
    # the budget must cover before windows shrink.
    stream_window: int = 16 * 1024 * 1024
    connection_window: int = 16 * 1024 * 1024
    max_frame_bytes: int = 1 << 20
    # Request bytes held or granted credit for (inflated ones too): per connection, per peer
    # address and for the whole server (``ByteBudget``); a message larger than any of them is
    # refused. A peer's share holds one message of Triton's largest; the server's, three
    # peers' (6 GiB: a quarter of a 24 GiB machine).
    max_connection_buffered_bytes: int = 2**31
    max_peer_buffered_bytes: int = 2**31
    max_buffered_bytes: int = 3 * 2**31
    # Requests one ModelStreamInfer call may have in flight; more wait unread.
    max_stream_requests: int = 256
    # A connection that has not sent its preface, or has had no call, for this long is closed
    # (grpc-core's handshake timeout and max_connection_idle).
    preface_timeout_s: float = 20.0
    idle_timeout_s: float = 300.0
    # A message that stops arriving for this long (its peer holding the server's buffer).
    message_progress_timeout_s: float = 60.0
    # Open connections on the listener; more are closed at once.
    max_connections: int = 1024
    # A connection older than this (give or take a tenth, so they do not all go at once) is
    # sent GOAWAY, so its client reconnects and a load balancer spreads clients again; calls
    # still running a grace later are ended. None: no limit (grpc-core's
    # max_connection_age and max_connection_age_grace).
    max_connection_age_s: float | None = None
    max_connection_age_grace_s: float | None = None
    flood: FloodLimits = field(default_factory=FloodLimits)


# The reader of every call until it needs one of its own: empty, and never fed.
NO_READER = MessageReader(0)


class Call:
    """One RPC (one HTTP/2 stream): the handler's view, and the transport's bookkeeping."""

    __slots__ = (
        "cancellation",
        "conn",
        "deadline",
        "encoding",
        "headers",
        "headers_sent",
        "held",
        "last_progress",
        "max_message",
        "messages",
        "pending",
        "reader",
        "recv_window",
        "rpc",
        "send_window",
        "state",
        "stream_id",
        "task",
        "timer",
        "trailers",
        "waiter",
        "withheld",
    )

    def __init__(self, conn: GrpcConnection, stream_id: int, rpc: Rpc, encoding: str,
                 headers: dict[str, str], send_window: int, recv_window: int,
                 max_message: int, cancellation: Cancellation):
        self.conn = conn
        self.stream_id = stream_id
        self.rpc = rpc
        self.encoding = encoding
        self.headers = headers  # the request's header fields, names in lower case
        # Owned by the call: the transport cancels it with the reason the call ended early.
        self.cancellation = cancellation
        self.state = OPEN
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.deadline: float | None = None
        self.headers_sent = False
        self.send_window = SendWindow(send_window)
        self.recv_window = RecvWindow(recv_window)
        self.pending: deque[bytes | memoryview] = deque()  # waiting for flow-control credit
        self.trailers: bytes | None = None  # sent once ``pending`` is empty
        # Its own reader once bytes come that are not one whole request (``Inbound``).
        self.reader = NO_READER
        self.max_message = max_message
        self.messages: deque[Message] = deque()  # whole, not yet taken by the handler
        self.held = 0  # request bytes received and not yet taken by the handler
        self.withheld = 0  # received bytes whose stream credit has not been returned yet
        self.last_progress = 0.0
        # The handler's wait for a message or the end (``requests``); None while not waiting.
        self.waiter: asyncio.Future[None] | None = None

    # -- for handlers --------------------------------------------------------------------
    def write(self, message: Any) -> None:
        """Send one response message (dropped if the call has ended)."""
        self.conn.send(self, length_prefixed(message.SerializeToString()))

    @property
    def blocked(self) -> bool:
        """Whether a writer should ``drain`` before sending more (cheap to ask per message)."""
        return bool(self.pending) or self.conn.write_paused

    async def drain(self) -> None:
        """Wait while the peer or the socket is not taking this call's bytes."""
        conn = self.conn
        while self.state is not CLOSED and (self.pending or conn.write_paused):
            await conn.wait_writable()

    async def requests(self) -> AsyncIterator[Any]:
        """The client's messages, parsed, until it half-closes or the call ends; raises
        ``BadMessage`` for one that cannot be read."""
        while True:
            if self.messages:
                yield await self.conn.take_message(self)
            elif self.state is not OPEN:
                return
            else:
                self.waiter = asyncio.get_running_loop().create_future()
                await self.waiter

    # -- for the connection --------------------------------------------------------------
    def move(self, event: CallEvent) -> CallState:
        """Make ``event``'s move in the table (IllegalMove if it lists none); the new
        state. The connection applies the move's side effects."""
        state = MOVES.get((self.state, event))
        if state is None:
            state = next_state(self.state, event)  # raises IllegalMove
        self.state = state
        return state

    def wake(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class BadMessage(Exception):
    """A request message that cannot be read: it ends the call with ``status``."""

    def __init__(self, message: str, status: GrpcStatus = GrpcStatus.INVALID_ARGUMENT):
        super().__init__(message)
        self.status = status


def parse_message(parse: Callable[[bytes | memoryview], Any], data: bytes | memoryview) -> Any:
    try:
        return parse(data)
    except DecodeError as exc:
        raise BadMessage(f"request message does not parse: {exc}") from None
