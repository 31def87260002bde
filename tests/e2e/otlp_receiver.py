"""A real OTLP/HTTP trace receiver on loopback: decodes what the OpenTelemetry SDK exports
(``ExportTraceServiceRequest``) into plain span records the tests look at."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    events: list[str]
    event_attributes: dict[str, dict[str, Any]]
    status: int
    status_message: str
    start_ns: int
    end_ns: int
    resource: dict[str, Any] = field(default_factory=dict)


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind is not None else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def decode(body: bytes) -> list[Span]:
    message = ExportTraceServiceRequest.FromString(body)
    spans = []
    for resource_spans in message.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope in resource_spans.scope_spans:
            for span in scope.spans:
                spans.append(Span(
                    name=span.name, trace_id=span.trace_id.hex(), span_id=span.span_id.hex(),
                    parent_id=span.parent_span_id.hex(),
                    attributes=_attributes(span.attributes),
                    events=[event.name for event in span.events],
                    event_attributes={event.name: _attributes(event.attributes)
                                      for event in span.events},
                    status=span.status.code, status_message=span.status.message,
                    start_ns=span.start_time_unix_nano, end_ns=span.end_time_unix_nano,
                    resource=resource))
    return spans


class OtlpReceiver:
    """Listens on 127.0.0.1 (a free port); ``spans`` grows as the server exports."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                spans = decode(body)
                with receiver._changed:
                    receiver.spans.extend(spans)
                    receiver._changed.notify_all()
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"

    def wait_for(self, found: Callable[[list[Span]], bool], timeout: float = 20.0
                 ) -> list[Span]:
        """The spans received, once ``found(spans)`` holds (AssertionError after timeout)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not found(self.spans):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    names = [(s.name, s.trace_id[:8]) for s in self.spans]
                    raise AssertionError(f"spans never arrived; got {names}")
                self._changed.wait(remaining)
            return list(self.spans)

    def trace(self, trace_id: str, count: int, timeout: float = 20.0) -> list[Span]:
        """The ``count`` spans of one trace, once all arrived."""
        spans = self.wait_for(
            lambda got: sum(s.trace_id == trace_id for s in got) >= count, timeout)
        return [s for s in spans if s.trace_id == trace_id]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
