"""Serves ``/metrics`` in Prometheus text format on its own port, over the HTTP transport."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from tritium.frontends.http.exchange import HttpExchange
from tritium.frontends.http.limits import HttpLimits
from tritium.frontends.http.transport import HttpServer, start_http_server
from tritium.metrics.collector import CustomCollector, TritonCollector

log = logging.getLogger("tritium.metrics")

# Scrapers are few and send no bodies: the port needs far less than the inference port.
MAX_CONNECTIONS = 64
MAX_BODY_BYTES = 64 * 1024
CLOSE_WAIT_S = 2.0

# prometheus-client names every counter family "<name>_total" in its HELP and TYPE lines;
# Triton's counters carry no such suffix, and dashboards and Triton's own tests match the
# bare names, so the header lines are renamed to the names the samples use.
_TOTAL_HEADER = re.compile(rb"^# (HELP|TYPE) (\w+)_total ", re.MULTILINE)
_TEXT = [("Content-Type", "text/plain")]
_EXPOSITION = [("Content-Type", CONTENT_TYPE_LATEST)]


def render(registry: CollectorRegistry, custom: CustomCollector | None = None) -> bytes:
    """Triton's families, then the models' own (written by hand: prometheus-client would
    print their numbers differently from Triton)."""
    text = _TOTAL_HEADER.sub(rb"# \1 \2 ", generate_latest(registry))
    return text if custom is None else text + custom.render().encode()


def metrics_limits(http: HttpLimits) -> HttpLimits:
    """The inference port's waits, with the metrics port's own byte and connection caps."""
    cap = MAX_CONNECTIONS if http.max_connections is None else min(MAX_CONNECTIONS,
                                                                   http.max_connections)
    return dataclasses.replace(http, max_body_bytes=MAX_BODY_BYTES, max_connections=cap)


class MetricsServer:
    """The exposition is rendered on a worker thread, keeping the loop free while it reads
    every model's statistics; scrapes that arrive during a render share its result."""

    def __init__(self, models: Callable[[], Iterable[Any]],
                 custom: Callable[[], Iterable[Any]] | None = None):
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(TritonCollector(models))
        self._custom = CustomCollector(custom) if custom is not None else None
        self._server: HttpServer | None = None
        self._rendering: asyncio.Future[bytes] | None = None

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        return self._server.port

    async def start(self, address: str, port: int, limits: HttpLimits) -> None:
        self._server = await start_http_server(self, address, port, metrics_limits(limits),
                                               name="metrics")

    async def stop(self) -> None:
        """Stop listening and close every connection, waiting briefly for scrapes underway."""
        server = self._server
        if server is None:
            return
        server.close()
        server.close_when_idle()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CLOSE_WAIT_S):
                await server.wait_closed()

    async def __call__(self, exchange: HttpExchange) -> None:
        request = exchange.request
        if request.path != "/metrics":
            status, headers, body = 404, _TEXT, b"Not Found"
        elif request.method != "GET":
            status, headers, body = 405, _TEXT, b"Method Not Allowed"
        else:
            status, headers, body = 200, _EXPOSITION, await self._render()
        exchange.respond(status, headers, body)
        if log.isEnabledFor(logging.DEBUG):  # an access log, as at --log-verbose 1
            query = f"?{request.query}" if request.query else ""
            log.debug('metrics: "%s %s%s HTTP/%s" %d %d', request.method, request.path, query,
                      request.http_version, status, len(body))

    async def _render(self) -> bytes:
        rendering = self._rendering
        if rendering is None:
            loop = asyncio.get_running_loop()
            rendering = self._rendering = loop.run_in_executor(None, render, self.registry,
                                                               self._custom)
            rendering.add_done_callback(self._rendered)
        return await asyncio.shield(rendering)

    def _rendered(self, _: asyncio.Future[bytes]) -> None:
        self._rendering = None
