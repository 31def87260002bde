"""HTTP/1.1 server transport on httptools and asyncio: bytes in, exchanges out, no inference."""

from __future__ import annotations

import asyncio
import ssl

from tritium.frontends.http.connection import (
    App,
    ConnectionRegistry,
    HttpConnection,
    HttpLimits,
)
from tritium.frontends.http.exchange import Body, BodyPart, HttpExchange, HttpRequest

__all__ = [
    "App",
    "Body",
    "BodyPart",
    "HttpExchange",
    "HttpLimits",
    "HttpRequest",
    "HttpServer",
    "start_http_server",
]


class HttpServer:
    """A listening socket and its connections; one periodic sweep enforces the timeouts.

    The sweep, not a timer per request, keeps the hot path free of timer bookkeeping (it also
    ticks the coarse clock connections read); a timeout fires up to half its length late.
    """

    def __init__(self, server: asyncio.Server, registry: ConnectionRegistry, limits: HttpLimits):
        self._server = server
        self._registry = registry
        self.port: int = server.sockets[0].getsockname()[1]
        self._interval = min(1.0, max(0.01, min(limits.header_timeout_s,
                                                 limits.keepalive_timeout_s) / 4))
        self._loop = asyncio.get_running_loop()
        self._sweeper: asyncio.TimerHandle | None = self._loop.call_later(
            self._interval, self._sweep)

    def close(self) -> None:
        """Stop accepting new connections; open ones keep being served."""
        self._server.close()

    def close_idle_connections(self) -> None:
        """Close connections with no request in progress, queued or partly received."""
        for conn in list(self._registry.connections):
            conn.close_if_idle()

    def active_connections(self) -> int:
        """Open connections, plus closed ones whose app call has not returned yet."""
        return len(self._registry.connections)

    async def wait_closed(self) -> None:
        """Wait until every connection is gone (call close() first to stop new ones)."""
        await self._registry.wait_empty()
        if not self._server.is_serving():
            await self._server.wait_closed()
            self._stop_sweeping()

    def _sweep(self) -> None:
        now = self._registry.now = self._loop.time()
        # Connections stamp times from the coarse clock, up to one interval behind the real
        # one; judging by a clock held back as far means no timeout ever fires early.
        for conn in list(self._registry.connections):
            conn.check_timeouts(now - self._interval)
        if self._server.is_serving() or self._registry.connections:
            self._sweeper = self._loop.call_later(self._interval, self._sweep)
        else:
            self._sweeper = None

    def _stop_sweeping(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None


async def start_http_server(app: App, host: str, port: int, limits: HttpLimits, *,
                            ssl_context: ssl.SSLContext | None = None) -> HttpServer:
    """Listen on ``host:port`` (0: any free port) and serve every request with ``app``
    (over TLS when ``ssl_context`` is given)."""
    registry = ConnectionRegistry()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: HttpConnection(app, limits, registry), host, port, backlog=1024,
        reuse_address=True, ssl=ssl_context,
    )
    return HttpServer(server, registry, limits)
