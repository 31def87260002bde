"""Serves ``/metrics`` on its own port, from a thread, in Prometheus text format."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from tritium.metrics.collector import TritonCollector

log = logging.getLogger("tritium.metrics")

# prometheus-client names every counter family "<name>_total" in its HELP and TYPE lines;
# Triton's counters carry no such suffix, and dashboards and Triton's own tests match the
# bare names, so the header lines are renamed to the names the samples use.
_TOTAL_HEADER = re.compile(rb"^# (HELP|TYPE) (\w+)_total ", re.MULTILINE)


def render(registry: CollectorRegistry) -> bytes:
    return _TOTAL_HEADER.sub(rb"# \1 \2 ", generate_latest(registry))


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        log.debug("metrics: " + format, *args)


class MetricsServer:
    def __init__(self, models: Callable[[], Iterable[Any]], address: str, port: int,
                 custom: Callable[[], Iterable[Any]] | None = None):
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(TritonCollector(models, custom))
        self._httpd = make_server(address, port, self._app, _Server, handler_class=_QuietHandler)
        self.port: int = self._httpd.server_port
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="metrics",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterator[bytes]:
        if environ.get("PATH_INFO") != "/metrics":
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return iter([b"Not Found"])
        if environ.get("REQUEST_METHOD") != "GET":
            start_response("405 Method Not Allowed", [("Content-Type", "text/plain")])
            return iter([b"Method Not Allowed"])
        body = render(self.registry)
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST)])
        return iter([body])
