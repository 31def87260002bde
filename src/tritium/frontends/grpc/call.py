"""A gRPC call as its handler sees it, the method table, and the transport's limits."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from google.protobuf.message import DecodeError

from tritium.core.cancellation import CancelReason
from tritium.frontends.grpc.http2 import length_prefixed

if TYPE_CHECKING:
    from tritium.frontends.grpc.connection import GrpcConnection

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
    # Large receive windows: a request's bytes are buffered whole anyway, so per-stream flow
    # control would only add round trips.
    stream_window: int = 16 * 1024 * 1024
    connection_window: int = 1 << 30
    max_frame_bytes: int = 1 << 20


class Call:
    """One RPC (one HTTP/2 stream) as its handler sees it."""

    __slots__ = (
        "_waiter",
        "cancel_reason",
        "conn",
        "deadline",
        "encoding",
        "ended",
        "headers",
        "headers_sent",
        "inbuf",
        "messages",
        "pending",
        "recv_unacked",
        "remote_closed",
        "rpc",
        "send_window",
        "stream_id",
        "task",
        "timer",
        "trailers",
    )

    def __init__(self, conn: GrpcConnection, stream_id: int, rpc: Rpc, encoding: str,
                 send_window: int, headers: dict[str, str]):
        self.conn = conn
        self.headers = headers  # the request's header fields, names in lower case
        self.stream_id = stream_id
        self.rpc = rpc
        self.encoding = encoding
        self.cancel_reason: CancelReason | None = None
        self.ended = False
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.deadline: float | None = None
        self.remote_closed = False
        self.headers_sent = False
        self.send_window = send_window
        self.pending: deque[bytes | memoryview] = deque()  # bytes waiting for flow-control credit
        self.trailers: bytes | None = None  # sent once ``pending`` is empty
        self.inbuf = bytearray()
        self.messages: deque[bytes | memoryview] = deque()
        self.recv_unacked = 0
        self._waiter: asyncio.Future[None] | None = None

    # -- for handlers --------------------------------------------------------------------
    def write(self, message: Any) -> None:
        """Send one response message (dropped if the call has ended)."""
        if not self.ended:
            self.conn.send(self, length_prefixed(message.SerializeToString()), None)

    @property
    def blocked(self) -> bool:
        """Whether a writer should ``drain`` before sending more (cheap to ask per message)."""
        return bool(self.pending) or self.conn.write_paused

    async def drain(self) -> None:
        """Wait while the peer or the socket is not taking this call's bytes."""
        conn = self.conn
        while not self.ended and (self.pending or conn.write_paused):
            await conn.wait_writable()

    async def requests(self) -> AsyncIterator[Any]:
        """The client's messages, parsed, until it half-closes; raises TritiumError-free
        ``ValueError`` for a message that cannot be parsed."""
        parse = self.rpc.request_type.FromString
        while True:
            if self.messages:
                yield parse_message(parse, self.messages.popleft())
            elif self.remote_closed or self.ended:
                return
            else:
                self._waiter = asyncio.get_running_loop().create_future()
                await self._waiter

    # -- for the connection --------------------------------------------------------------
    def wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class BadMessage(Exception):
    """A request message that does not parse as the method's request type."""


def parse_message(parse: Callable[[bytes | memoryview], Any], data: bytes | memoryview) -> Any:
    try:
        return parse(data)
    except DecodeError as exc:
        raise BadMessage(f"request message does not parse: {exc}") from None


