"""Serves ``/metrics`` in Prometheus text format on its own port, over the HTTP transport,
and the live page beside it; polls the per-interval figures (CPU, the page's history)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from tritium.core.restrictions import Restriction
from tritium.feature_config import LatencyMetrics
from tritium.frontends.http.exchange import HttpExchange
from tritium.frontends.http.limits import HttpLimits
from tritium.frontends.http.restricted import refusal
from tritium.frontends.http.transport import HttpServer, start_http_server
from tritium.metrics import live
from tritium.metrics.collector import CustomCollector, TritonCollector
from tritium.metrics.history import History
from tritium.metrics.host import HostCollector, HostSampler

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
_HTML = [("Content-Type", "text/html; charset=utf-8"), ("Cache-Control", "no-store")]
_JSON = [("Content-Type", "application/json"), ("Cache-Control", "no-store")]


@dataclass(frozen=True, slots=True)
class MetricsOptions:
    """What the flags say of the metrics port beyond its address."""

    interval_s: float = 2.0  # --metrics-interval-ms: how often per-interval figures are read
    cpu: bool = True  # --allow-cpu-metrics
    # --http-restricted-api live:KEY=VALUE: the page and its state need the header.
    live_restriction: Restriction | None = None
    latency: LatencyMetrics = field(default_factory=LatencyMetrics)  # --metrics-config


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
    """``/metrics``, and with a catalog of models the live page (``/live``, ``/live/state``).

    The exposition is rendered on a worker thread, keeping the loop free while it reads
    every model's statistics; scrapes that arrive during a render share its result. The
    page's state is small and read on the loop."""

    def __init__(self, models: Callable[[], Iterable[Any]],
                 custom: Callable[[], Iterable[Any]] | None = None,
                 catalog: live.Catalog | None = None, options: MetricsOptions | None = None):
        options = options or MetricsOptions()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(TritonCollector(models, options.latency))
        self._models = models
        self._custom = CustomCollector(custom) if custom is not None else None
        self._host = HostSampler() if options.cpu else None
        if self._host is not None:
            self.registry.register(HostCollector(self._host))
        self._interval_s = options.interval_s
        self._history = History(options.interval_s)
        self._live = (live.LiveState(catalog, self._history, self._host, options.interval_s)
                      if catalog is not None else None)
        self._live_restriction = options.live_restriction
        self._server: HttpServer | None = None
        self._rendering: asyncio.Future[bytes] | None = None
        self._poller: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        return self._server.port

    async def start(self, address: str, port: int, limits: HttpLimits) -> None:
        self._server = await start_http_server(self, address, port, metrics_limits(limits),
                                               name="metrics")
        self._poller = asyncio.get_running_loop().create_task(self._poll(), name="metrics-poll")

    async def stop(self) -> None:
        """Stop listening and close every connection, waiting briefly for scrapes underway."""
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
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
        status, headers, body = await self._answer(request.method, request.path,
                                                   request.headers)
        exchange.respond(status, headers, body)
        if log.isEnabledFor(logging.DEBUG):  # an access log, as at --log-verbose 1
            query = f"?{request.query}" if request.query else ""
            log.debug('metrics: "%s %s%s HTTP/%s" %d %d', request.method, request.path, query,
                      request.http_version, status, len(body))

    async def _answer(self, method: str, path: str, headers: Mapping[str, str]
                      ) -> tuple[int, list[tuple[str, str]], bytes]:
        page = self._live is not None and path in (live.PAGE_PATH, live.STATE_PATH)
        if path != "/metrics" and not page:
            return 404, _TEXT, b"Not Found"
        restriction = self._live_restriction
        if page and restriction is not None and not restriction.allows(headers):
            # As the HTTP port's restricted groups: refused before the method is looked at.
            return 403, _JSON, refusal(restriction)
        if method != "GET":
            return 405, _TEXT, b"Method Not Allowed"
        if path == live.PAGE_PATH:
            return 200, _HTML, live.page()
        if path == live.STATE_PATH:
            assert self._live is not None
            return 200, _JSON, self._live.render()
        return 200, _EXPOSITION, await self._render()

    async def _poll(self) -> None:
        """Each interval: the CPU figures and the page's history. Both reads are small
        (two /proc files, a few counters per model) and run on the loop, where the
        statistics are written."""
        while True:
            try:
                if self._host is not None:
                    self._host.poll()
                self._history.sample(self._models())
            except Exception:  # a figure missing for one interval must not end the polling
                log.exception("metrics: reading the per-interval figures failed")
            await asyncio.sleep(self._interval_s)

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
