"""The gRPC endpoint: a listening socket on the server's event loop, the asyncio shell around
each sans-IO connection, and the sweep that times out what peers leave hanging.

The transport is our own HTTP/2 (``connection.py``) rather than grpc.aio: grpc.aio spends
250 to 430 µs of CPU per unary call on the 2-core machine we measure on, several times the
inference it carries; framing gRPC on asyncio directly costs a small fraction of that.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
from collections.abc import Callable

from tritium.core.inflight import InFlight
from tritium.frontends.grpc.call import Call, GrpcLimits, Router
from tritium.frontends.grpc.connection import GrpcConnection
from tritium.frontends.grpc.http2 import Chunk
from tritium.frontends.grpc.status import GrpcStatus
from tritium.frontends.grpc.windows import ByteBudget, PeerBudgets
from tritium.tls import Handshakes, handshake_cap

log = logging.getLogger("tritium.grpc")

# The socket's buffer above which a connection stops reading from its peer.
_WRITE_HIGH_WATER = 4 * 1024 * 1024
_SWEEP_S = 1.0
# How long a closed connection still reads (and drops) what its peer had already sent.
_LINGER_S = 2.0
# How long the end of a lame duck waits for its connections' final GOAWAYs (a peer that does
# not answer the PING gets its final GOAWAY within _PING_ANSWER_S and a sweep).
LEAVE_WAIT_S = 4.0


class GrpcEndpoint:
    """What the listener's connections share: routes, limits, the byte budget and each
    peer's share of it, the calls in flight (for the drain at shutdown) and the open
    connections."""

    def __init__(self, routes: Router, limits: GrpcLimits):
        self.routes = routes
        self.limits = limits
        self.budget = ByteBudget(limits.max_buffered_bytes)
        self.peers = PeerBudgets(self.budget, limits.max_peer_buffered_bytes)
        self.calls: InFlight[Call] = InFlight()
        self.connections: set[GrpcProtocol] = set()
        self.refusing_calls = False  # see GrpcConnection.refusing_calls
        self.leaving = False  # see GrpcConnection.leave_after_a_call
        self.settled = asyncio.Event()  # a connection had its final GOAWAY, or ended


class GrpcProtocol(asyncio.Protocol):
    """The asyncio shell: hands bytes to the connection and its output to the socket."""

    def __init__(self, endpoint: GrpcEndpoint):
        self._endpoint = endpoint
        self.transport: asyncio.Transport
        self.conn: GrpcConnection | None = None
        self._linger: asyncio.TimerHandle | None = None
        self._peer = ""  # the address whose share of the byte budget this connection uses

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        endpoint = self._endpoint
        if len(endpoint.connections) >= endpoint.limits.max_connections:
            log.warning("refusing a gRPC connection: %d are open (the limit)",
                        len(endpoint.connections))
            transport.close()
            return
        self.transport.set_write_buffer_limits(high=_WRITE_HIGH_WATER)
        self._peer = _address(transport)
        self.conn = GrpcConnection(endpoint.routes, endpoint.limits, self,
                                   budget=endpoint.peers.join(self._peer),
                                   calls=endpoint.calls)
        self.conn.refusing_calls = endpoint.refusing_calls
        self.conn.leave_after_a_call = endpoint.leaving
        self.conn.settled = endpoint.settled.set
        endpoint.connections.add(self)

    def data_received(self, data: bytes) -> None:
        if self.conn is not None and not self.conn.closed:
            self.conn.receive(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._linger is not None:
            self._linger.cancel()
        self._endpoint.connections.discard(self)
        self._endpoint.settled.set()
        if self.conn is not None:
            self.conn.lost()
            self._endpoint.peers.leave(self._peer)

    def pause_writing(self) -> None:
        if self.conn is not None:
            self.conn.set_write_paused(True)

    def resume_writing(self) -> None:
        if self.conn is not None:
            self.conn.set_write_paused(False)

    # -- Output, for the connection ----------------------------------------------------------
    def write(self, chunks: list[Chunk]) -> None:
        if len(chunks) <= 3:  # a small reply: one buffer is cheapest
            self.transport.write(b"".join(chunks))
        else:  # large data: its views go to the socket without being joined
            self.transport.writelines(chunks)

    def close(self) -> None:
        """Close once what was written is out, without a reset. A socket closed while its
        peer's bytes are still arriving (a proxy opening one more stream as our GOAWAY
        crosses it) answers them with RST, and the peer's kernel then drops what it had not
        yet read: the trailers of the last answer, which its client sees as a broken call.
        So after a graceful GOAWAY the write side is shut first, and the read side drained
        until the peer closes too, for at most _LINGER_S; any other close is abrupt."""
        transport = self.transport
        graceful = self.conn is not None and self.conn.going_away
        # TLS transports cannot half-close.
        if not graceful or transport.is_closing() or not transport.can_write_eof():
            transport.close()
            return
        if self._linger is not None:  # already lingering
            return
        transport.write_eof()
        transport.resume_reading()
        self._linger = asyncio.get_running_loop().call_later(_LINGER_S, transport.close)

    def pause_reading(self) -> None:
        if not self.transport.is_closing():
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if not self.transport.is_closing():
            self.transport.resume_reading()


def _address(transport: asyncio.BaseTransport) -> str:
    """The peer's address without its port (its host, not its connection)."""
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else str(peer)


class GrpcServer:
    """A started gRPC endpoint; ``port`` is the bound port (useful when asked for 0)."""

    def __init__(self, server: asyncio.Server, endpoint: GrpcEndpoint,
                 factory: Callable[[], asyncio.Protocol],
                 handshakes: Handshakes | None = None):
        self._server = server
        self._endpoint = endpoint
        self._factory = factory  # what makes a listener's connection (TLS or not)
        self._handshakes = handshakes
        self.port: int = server.sockets[0].getsockname()[1]
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    def ask_clients_to_leave(self) -> None:
        """A graceful GOAWAY on every connection: calls in flight finish, and clients open
        their next call on a new connection (through their load balancer, elsewhere). New
        connections are still served, and asked to leave once their first call has begun:
        a proxy that has not noticed yet (nginx checks nothing) keeps no connection here."""
        self._endpoint.leaving = True
        for shell in list(self._endpoint.connections):
            conn = shell.conn
            if conn is None:
                continue
            if conn.http2:
                conn.go_away()
            else:  # its preface is on the way: its first call is served, as a new one's
                conn.leave_after_a_call = True

    async def stop_listening(self) -> None:
        """Take no more connections, lose none the kernel has already taken, and return
        once no open connection's peer may still open a stream expecting it served (every
        one has had its final GOAWAY), or after LEAVE_WAIT_S. From then on a proxy that
        sends here gets a refused connection, which it retries on another server.

        Closing a listening socket resets the connections in its accept queue, whose first
        call a proxy has already written, and so can no longer send elsewhere: they are
        accepted first (in one pass, without yielding to the loop) and served."""
        loop = asyncio.get_running_loop()
        accepted: list[socket.socket] = []
        for listener in self._server.sockets:
            taking = socket.socket(fileno=os.dup(listener.fileno()))
            taking.setblocking(False)
            try:
                while True:
                    accepted.append(taking.accept()[0])
            except OSError:  # BlockingIOError: the queue is empty (any other: stop taking)
                pass
            finally:
                taking.close()
        self._server.close()
        for sock in accepted:
            sock.setblocking(False)
            await loop.connect_accepted_socket(self._factory, sock)
        self.ask_clients_to_leave()
        endpoint = self._endpoint
        deadline = loop.time() + LEAVE_WAIT_S
        while any(shell.conn is not None and shell.conn.may_open_streams
                  for shell in endpoint.connections):
            endpoint.settled.clear()  # set when a connection has its final GOAWAY, or ends
            try:
                await asyncio.wait_for(endpoint.settled.wait(), deadline - loop.time())
            except TimeoutError:
                return

    def refuse_new_calls(self) -> None:
        """From now on every new call, on any connection, is refused unprocessed, and new
        connections are refused: the server stopped admitting, and a client or proxy can
        send the call to another server (a proxy retries a refused connection, which it
        cannot do with a gRPC call it already sent)."""
        self._server.close()
        if self._handshakes is not None:
            self._handshakes.close()
        self._endpoint.refusing_calls = True
        for shell in list(self._endpoint.connections):
            if shell.conn is not None:
                shell.conn.refusing_calls = True
        self.ask_clients_to_leave()

    async def stop(self, grace: float) -> None:
        """Refuse new calls, give running ones ``grace`` seconds, then end the rest
        UNAVAILABLE (their requests are cancelled as SHUTDOWN)."""
        self._server.close()
        if self._handshakes is not None:
            self._handshakes.close()
        self._sweeper.cancel()
        endpoint = self._endpoint
        self.ask_clients_to_leave()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(endpoint.calls.wait_empty(), timeout=grace)
        for shell in list(endpoint.connections):
            if shell.conn is not None:
                shell.conn.shut_down(GrpcStatus.UNAVAILABLE, "the server is shutting down")
        await self._server.wait_closed()

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(_SWEEP_S)
            now = loop.time()
            for shell in list(self._endpoint.connections):
                if shell.conn is not None:
                    shell.conn.check_timeouts(now)


async def start_grpc_server(routes: Router, address: str, port: int, *,
                            limits: GrpcLimits | None = None,
                            ssl_context: ssl.SSLContext | None = None) -> GrpcServer:
    """Bind ``address:port`` and serve ``routes`` on the running event loop (over TLS when
    ``ssl_context`` is given)."""
    endpoint = GrpcEndpoint(routes, limits or GrpcLimits())
    loop = asyncio.get_running_loop()

    def connection() -> asyncio.Protocol:
        return GrpcProtocol(endpoint)

    handshakes = None
    factory = connection
    if ssl_context is not None:
        # A TLS handshake is part of the preface: it gets the same time, not asyncio's 60 s.
        handshakes = Handshakes(ssl_context, connection,
                                handshake_cap(endpoint.limits.max_connections),
                                endpoint.limits.preface_timeout_s, "gRPC")
        factory = handshakes.protocol
    try:
        server = await loop.create_server(factory, address, port, backlog=1024,
                                          reuse_address=True)
    except OSError as exc:
        raise OSError(f"gRPC endpoint cannot bind {address}:{port}: {exc.strerror}") from None
    return GrpcServer(server, endpoint, factory, handshakes)
