"""TLS for a listener: the files it uses, the server-side ``ssl.SSLContext`` from them, and
the bounded set of handshakes under way."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

log = logging.getLogger("tritium.tls")


class TlsError(Exception):
    """A TLS setting that cannot be used; the message names the file and the reason."""


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """PEM files for one listener; ``mutual`` requires and verifies a client certificate
    issued under ``root_cert``."""

    server_cert: Path
    server_key: Path
    root_cert: Path | None = None
    mutual: bool = False


def server_context(settings: TlsSettings, alpn: list[str]) -> ssl.SSLContext:
    """A TLS 1.2+ server context offering ``alpn`` (gRPC needs ``h2``: its clients refuse a
    server that selects no protocol)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(alpn)
    _load_chain(context, settings)
    if settings.mutual:
        # Only the given root is trusted, never the system's store: mutual TLS admits the
        # clients this deployment issued certificates to, not anyone with a public one.
        if settings.root_cert is None:
            raise TlsError("mutual TLS needs a root certificate to verify clients with")
        _readable(settings.root_cert, "root certificate")
        try:
            context.load_verify_locations(cafile=str(settings.root_cert))
        except ssl.SSLError as exc:
            raise TlsError(f"root certificate '{settings.root_cert}': {_reason(exc)}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _load_chain(context: ssl.SSLContext, settings: TlsSettings) -> None:
    _readable(settings.server_cert, "server certificate")
    _readable(settings.server_key, "server key")
    try:
        context.load_cert_chain(str(settings.server_cert), str(settings.server_key))
    except ssl.SSLError as exc:
        raise TlsError(f"server certificate '{settings.server_cert}' and key "
                       f"'{settings.server_key}': {_reason(exc)}") from None


def _readable(path: Path, what: str) -> None:
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise TlsError(f"cannot read {what} '{path}': {exc.strerror}") from None


def _reason(exc: ssl.SSLError) -> str:
    # "key values mismatch" reads better than "[X509: KEY_VALUES_MISMATCH] key values
    # mismatch (_ssl.c:4041)".
    reason = exc.reason or ""
    return reason.lower().replace("_", " ") if reason else str(exc)


# Handshakes one listener lets run at once, when no cap is given: a share of its connection
# cap (each holds a descriptor), never fewer than this.
MIN_HANDSHAKES = 16
HANDSHAKE_SHARE = 4
# Bytes a peer may send before its handshake begins (a ClientHello is a few hundred).
MAX_EARLY_BYTES = 64 * 1024

Factory = Callable[[], asyncio.Protocol]


class Handshakes:
    """The TLS handshakes under way on one listener, each on a plain TCP connection.

    A peer becomes a connection of the listener (counted against its connection cap) only
    once its handshake is done. Until then it is one of at most ``cap`` handshakes, each
    bounded by ``timeout_s``; when a new peer finds them all taken, the oldest gives way. A
    flood of peers that connect and never say hello therefore holds ``cap`` descriptors, and
    a real client's handshake, done in milliseconds, is never starved by them for long.
    """

    def __init__(self, context: ssl.SSLContext, factory: Factory, cap: int,
                 timeout_s: float, name: str):
        self._context = context
        self._factory = factory
        self.cap = cap
        self._timeout_s = timeout_s
        self._name = name
        # Oldest first: a dict keeps insertion order.
        self._pending: dict[asyncio.Transport, asyncio.Task[None]] = {}
        self._crowded = False

    def protocol(self) -> asyncio.Protocol:
        """The listener's protocol factory (for ``create_server`` without ``ssl=``)."""
        return _Greeting(self)

    def __len__(self) -> int:
        return len(self._pending)

    def close(self) -> None:
        """End every handshake still under way (the listener is closing)."""
        for transport in list(self._pending):
            transport.abort()

    def _begin(self, greeting: _Greeting, transport: asyncio.Transport) -> None:
        if len(self._pending) >= self.cap:
            self._make_room()
        loop = asyncio.get_running_loop()
        starting = loop.create_task(loop.start_tls(
            transport, _Holder(), self._context, server_side=True,
            ssl_handshake_timeout=self._timeout_s))
        # Runs just after start_tls's first step, which put TLS in charge of the transport
        # and scheduled its start: bytes the peer sent before then are handed to TLS after
        # that start, ahead of anything read later.
        loop.call_soon(loop.call_soon, greeting.hand_over_early_bytes)
        self._pending[transport] = loop.create_task(self._secure(transport, starting))

    def _make_room(self) -> None:
        if not self._crowded:
            self._crowded = True
            log.warning("%s port: %d TLS handshakes under way, the most allowed: the oldest "
                        "give way to new ones", self._name, self.cap)
        oldest = next(iter(self._pending))
        del self._pending[oldest]
        oldest.abort()

    def _lost(self, transport: asyncio.Transport) -> None:
        task = self._pending.pop(transport, None)
        if task is not None:
            task.cancel()

    async def _secure(self, transport: asyncio.Transport,
                      starting: asyncio.Task[asyncio.Transport | None]) -> None:
        try:
            secured = await starting
        except asyncio.CancelledError:
            starting.cancel()
            transport.abort()
            raise
        except Exception as exc:
            # A peer that left, spoke something else or took too long: not worth a warning.
            log.debug("%s port: TLS handshake failed: %r", self._name, exc)
            transport.abort()
            return
        finally:
            self._pending.pop(transport, None)
            if self._crowded and len(self._pending) < self.cap:
                self._crowded = False
        if secured is None:
            transport.abort()
            return
        holder = secured.get_protocol()
        assert isinstance(holder, _Holder)
        holder.hand_over(secured, self._factory())


class _Greeting(asyncio.Protocol):
    """A TCP connection before its TLS handshake: it joins the handshakes at once, and keeps
    what the peer sends until TLS takes the transport over (uvloop starts reading as soon
    as a connection is made, whatever the protocol asked)."""

    def __init__(self, handshakes: Handshakes):
        self._handshakes = handshakes
        self._transport: asyncio.Transport | None = None
        self._early: list[bytes] = []
        self._early_bytes = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._handshakes._begin(self, self._transport)

    def data_received(self, data: bytes) -> None:
        self._early.append(data)
        self._early_bytes += len(data)
        if self._early_bytes > MAX_EARLY_BYTES and self._transport is not None:
            self._transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is not None:
            self._handshakes._lost(self._transport)

    def hand_over_early_bytes(self) -> None:
        transport, early = self._transport, b"".join(self._early)
        self._early = []
        if transport is None or transport.is_closing() or not early:
            return
        tls = transport.get_protocol()
        if tls is self:
            return  # start_tls failed before taking the transport: it is being closed
        _feed(tls, early)


def _feed(protocol: asyncio.BaseProtocol, data: bytes) -> None:
    """Deliver ``data`` to ``protocol`` as its transport would have."""
    # uvloop's TLS protocol reads into buffers without deriving from BufferedProtocol.
    get_buffer = getattr(protocol, "get_buffer", None)
    if get_buffer is None:
        cast(asyncio.Protocol, protocol).data_received(data)
        return
    updated = cast(asyncio.BufferedProtocol, protocol).buffer_updated
    view = memoryview(data)
    while view:
        buffer = memoryview(get_buffer(len(view)))
        size = min(len(buffer), len(view))
        buffer[:size] = view[:size]
        updated(size)
        view = view[size:]


class _Holder(asyncio.Protocol):
    """The protocol of a connection from the end of its handshake until the listener's own
    is made for it: what arrives meanwhile (a client's first request may come with its last
    handshake message) is kept and handed over in order."""

    def __init__(self) -> None:
        self._events: list[tuple[str, Any]] = []

    def data_received(self, data: bytes) -> None:
        self._events.append(("data", data))

    def eof_received(self) -> bool:
        self._events.append(("eof", None))
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._events.append(("lost", exc))

    def hand_over(self, transport: asyncio.BaseTransport, protocol: asyncio.Protocol) -> None:
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        for kind, value in self._events:
            if kind == "data":
                protocol.data_received(value)
            elif kind == "eof":
                if not protocol.eof_received():
                    transport.close()
            else:
                protocol.connection_lost(value)


def handshake_cap(connection_cap: int) -> int:
    """How many handshakes a listener with ``connection_cap`` connections lets run."""
    return max(MIN_HANDSHAKES, connection_cap // HANDSHAKE_SHARE)
