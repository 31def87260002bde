"""The opentelemetry trace mode: spans exported over OTLP/HTTP by the OpenTelemetry SDK's
batch span processor, named, nested and attributed as Triton's.

This module imports the SDK; it is imported only once a request is traced in this mode.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import orjson
from opentelemetry import trace as otel_trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tritium.tracing.settings import DEFAULT_SERVICE_NAME, TraceSettings
from tritium.tracing.trace import CANCEL_REASON, ModelTrace, RootTrace

TRACER_NAME = "triton-server"  # the instrumentation scope Triton's spans carry
ROOT_SPAN = "InferRequest"
COMPUTE_SPAN = "compute"

_propagator = TraceContextTextMapPropagator()


def extract(carrier: Mapping[str, str]) -> Any:
    """The W3C context ``carrier`` (lower-case header names) holds, or None."""
    if "traceparent" not in carrier:
        return None
    context = _propagator.extract(carrier)
    span_context = otel_trace.get_current_span(context).get_span_context()
    return context if span_context.is_valid else None


def provider_for(settings: TraceSettings) -> TracerProvider:
    """A provider exporting to ``url`` (or OTEL_EXPORTER_OTLP_* / the SDK's default) with
    the batch span processor's settings (or OTEL_BSP_* / the SDK's defaults)."""
    attributes = dict(settings.resource)
    resource = Resource.create(attributes)
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    provider = TracerProvider(resource=resource)
    processor = BatchSpanProcessor(
        OTLPSpanExporter(endpoint=settings.url),
        max_queue_size=settings.bsp_max_queue_size,
        schedule_delay_millis=settings.bsp_schedule_delay,
        max_export_batch_size=settings.bsp_max_export_batch_size,
    )
    provider.add_span_processor(processor)
    return provider


class OtelSink:
    """Records a trace tree as spans; each is exported once it ends."""

    def __init__(self, provider: TracerProvider):
        self.provider = provider
        self.tracer = provider.get_tracer(TRACER_NAME)
        # Steady-clock timestamps become wall-clock ones by one offset, as Triton does.
        self.offset = time.time_ns() - time.monotonic_ns()

    def start_root(self, root: RootTrace, ns: int) -> Any:
        return self.tracer.start_span(ROOT_SPAN, context=root.parent_context,
                                      kind=SpanKind.SERVER, start_time=ns + self.offset)

    def start_model(self, trace: ModelTrace, parent: Any, ns: int) -> Any:
        attributes: dict[str, Any] = {
            "triton.model_name": trace.model_name,
            "triton.model_version": trace.model_version,
            "triton.trace_id": trace.id,
            "triton.trace_parent_id": trace.parent_id,
        }
        if trace.request_id:
            attributes["triton.request_id"] = trace.request_id
        return self._child(trace.model_name, parent, ns, attributes)

    def start_compute(self, trace: ModelTrace, ns: int) -> Any:
        return self._child(COMPUTE_SPAN, trace.span, ns, None)

    def _child(self, name: str, parent: Any, ns: int, attributes: dict[str, Any] | None
               ) -> Any:
        return self.tracer.start_span(name, context=otel_trace.set_span_in_context(parent),
                                      kind=SpanKind.SERVER, attributes=attributes,
                                      start_time=ns + self.offset)

    def event(self, trace: ModelTrace | RootTrace, span: Any, name: str, ns: int,
              attributes: dict[str, Any] | None = None) -> None:
        span.add_event(name, attributes=attributes, timestamp=ns + self.offset)
        if attributes:
            span.set_attributes(attributes)
            reason = attributes.get(CANCEL_REASON)
            if reason is not None:
                span.set_status(Status(StatusCode.ERROR, f"Request cancelled: {reason}"))

    def end(self, span: Any, ns: int, error: str | None = None) -> None:
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=ns + self.offset)

    def finished(self, root: RootTrace) -> None:
        pass

    def context(self, span: Any) -> str | None:
        ids = span.get_span_context()
        parent = f"00-{ids.trace_id:032x}-{ids.span_id:016x}-{ids.trace_flags:02x}"
        return orjson.dumps({"traceparent": parent}).decode()

    def tensor(self, trace: ModelTrace, activity: str, tensor: Any) -> None:
        pass  # as in Triton, the OpenTelemetry mode records no tensors

    def close(self) -> None:
        """Export what is queued and stop (blocking: call off the event loop)."""
        self.provider.shutdown()
