"""The HTTP/1.1 listener on httptools and asyncio: a capped set of connections and the sweep
that enforces their timeouts. Bytes in, exchanges out, no inference."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import cast

from tritium.core.inflight import InFlight
from tritium.frontends.http.connection import HttpConnection
from tritium.frontends.http.exchange import App, encode_error
from tritium.frontends.http.limits import HttpLimits
from tritium.tls import Handshakes, handshake_cap

logger = logging.getLogger("tritium.http")


class OpenConnections:
    """One listener's open connections, their cap, and the coarse clock their timeouts read.

    ``now`` is the loop time at the listener's last sweep: reading it costs nothing on the
    hot path, and timeouts are only as exact as the sweep interval anyway. A connection stays
    a member until its app call returns, even after the peer left: it still holds memory.
    """

    def __init__(self, cap: int, name: str = "HTTP"):
        self.members: InFlight[HttpConnection] = InFlight()
        self.cap = cap
        self.now = asyncio.get_running_loop().time()
        self._name = name
        self._refusing = False
        self.draining = False  # each connection closes once it has nothing in progress
        self.last_exchanges = False  # each connection's next response is its last

    def full(self) -> bool:
        """At the cap: log the first refusal of a run of them."""
        if len(self.members) < self.cap:
            return False
        if not self._refusing:
            self._refusing = True
            logger.warning("%s port: %d connections open, the most allowed: refusing new ones",
                           self._name, self.cap)
        return True

    def add(self, conn: HttpConnection) -> None:
        self.members.add(conn)

    def discard(self, conn: HttpConnection) -> None:
        self.members.discard(conn)
        if self._refusing and len(self.members) < self.cap:
            self._refusing = False
            logger.info("%s port: accepting connections again", self._name)

    def __len__(self) -> int:
        return len(self.members)

    async def wait_empty(self) -> None:
        await self.members.wait_empty()


class _Refusal(asyncio.Protocol):
    """A connection over the cap: told so in one response, then closed at once."""

    _ANSWER = encode_error(503, "too many open connections; try again later")

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        stream = cast(asyncio.Transport, transport)
        stream.write(self._ANSWER)
        stream.close()


class HttpServer:
    """A listening socket and its connections; one periodic sweep enforces the timeouts.

    The sweep, not a timer per request, keeps the hot path free of timer bookkeeping (it also
    ticks the coarse clock connections read); a timeout fires up to half its length late.
    """

    def __init__(self, server: asyncio.Server, connections: OpenConnections,
                 limits: HttpLimits, handshakes: Handshakes | None = None):
        self._server = server
        self._connections = connections
        self._handshakes = handshakes
        self.port: int = server.sockets[0].getsockname()[1]
        self._interval = min(1.0, max(0.01, limits.shortest_timeout() / 4))
        self._loop = asyncio.get_running_loop()
        self._sweeper: asyncio.TimerHandle | None = self._loop.call_later(
            self._interval, self._sweep)

    def close(self) -> None:
        """Stop accepting new connections; open ones keep being served."""
        self._server.close()
        if self._handshakes is not None:
            self._handshakes.close()

    def close_idle_connections(self) -> None:
        """Close connections with no request in progress, queued or partly received."""
        for conn in self._connections.members:
            conn.close_if_idle()

    def answer_last_exchanges(self) -> None:
        """Every connection, open or still to come, closes after its next response (which
        says ``Connection: close``), so keep-alive clients reconnect, through their load
        balancer, to another server; nothing is refused meanwhile."""
        self._connections.last_exchanges = True
        for conn in self._connections.members:
            conn.closing = True

    def close_when_idle(self) -> None:
        """Close every connection once it has no request in progress: the idle ones now,
        each busy one as soon as it finishes what it has (for a shutdown)."""
        self._connections.draining = True
        self.close_idle_connections()

    def active_connections(self) -> int:
        """Open connections, plus closed ones whose app call has not returned yet."""
        return len(self._connections)

    async def wait_closed(self) -> None:
        """Wait until every connection is gone (call close() first to stop new ones)."""
        await self._connections.wait_empty()
        if not self._server.is_serving():
            await self._server.wait_closed()
            self._stop_sweeping()

    def _sweep(self) -> None:
        connections = self._connections
        now = connections.now = self._loop.time()
        # Connections stamp times from the coarse clock, up to one interval behind the real
        # one; judging by a clock held back as far means no timeout ever fires early.
        for conn in connections.members:
            conn.check_timeouts(now - self._interval)
        if self._server.is_serving() or connections.members:
            self._sweeper = self._loop.call_later(self._interval, self._sweep)
        else:
            self._sweeper = None

    def _stop_sweeping(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None


async def start_http_server(app: App, host: str, port: int, limits: HttpLimits, *,
                            ssl_context: ssl.SSLContext | None = None,
                            name: str = "HTTP (--http-max-connections)") -> HttpServer:
    """Listen on ``host:port`` (0: any free port) and serve every request with ``app``
    (over TLS when ``ssl_context`` is given)."""
    connections = OpenConnections(limits.connection_cap(), name)

    def connection() -> asyncio.Protocol:
        if connections.full():
            return _Refusal()
        return HttpConnection(app, limits, connections)

    loop = asyncio.get_running_loop()
    handshakes = None
    factory: Callable[[], asyncio.Protocol] = connection
    if ssl_context is not None:
        # A TLS peer becomes a connection only once its handshake is done: until then, no
        # header timeout watches it, so the handshake gets a bound of the same length.
        handshakes = Handshakes(ssl_context, connection, handshake_cap(connections.cap),
                                limits.header_timeout_s, name)
        factory = handshakes.protocol
    server = await loop.create_server(factory, host, port, backlog=1024, reuse_address=True)
    return HttpServer(server, connections, limits, handshakes)
