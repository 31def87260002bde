"""The gRPC endpoint: a listening socket on the server's event loop and its connections.

The transport is our own HTTP/2 (``connection.py``) rather than grpc.aio: grpc.aio spends
250 to 430 µs of CPU per unary call on the 2-core machine we measure on, several times the
inference it carries; framing gRPC on asyncio directly costs a small fraction of that.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl

from tritium.frontends.grpc.call import GrpcLimits, Router
from tritium.frontends.grpc.connection import ConnectionRegistry, GrpcConnection
from tritium.frontends.grpc.http2 import GrpcStatus


class GrpcServer:
    """A started gRPC endpoint; ``port`` is the bound port (useful when asked for 0)."""

    def __init__(self, server: asyncio.Server, registry: ConnectionRegistry):
        self._server = server
        self._registry = registry
        self.port: int = server.sockets[0].getsockname()[1]

    async def stop(self, grace: float) -> None:
        """Refuse new calls, give running ones ``grace`` seconds, then end the rest
        UNAVAILABLE (their requests are cancelled as SHUTDOWN)."""
        self._server.close()
        for conn in list(self._registry.connections):
            conn.go_away()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._registry.wait_idle(), timeout=grace)
        for conn in list(self._registry.connections):
            conn.shut_down(GrpcStatus.UNAVAILABLE, "the server is shutting down")
        await self._server.wait_closed()


async def start_grpc_server(routes: Router, address: str, port: int, *,
                            limits: GrpcLimits | None = None,
                            ssl_context: ssl.SSLContext | None = None) -> GrpcServer:
    """Bind ``address:port`` and serve ``routes`` on the running event loop (over TLS when
    ``ssl_context`` is given)."""
    registry = ConnectionRegistry()
    chosen = limits or GrpcLimits()
    loop = asyncio.get_running_loop()
    try:
        server = await loop.create_server(
            lambda: GrpcConnection(routes, registry, chosen), address, port, backlog=1024,
            reuse_address=True, ssl=ssl_context)
    except OSError as exc:
        raise OSError(f"gRPC endpoint cannot bind {address}:{port}: {exc.strerror}") from None
    return GrpcServer(server, registry)
