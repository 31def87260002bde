"""Request tracing as Triton does it: ``--trace-config``, its JSON trace file or OpenTelemetry
spans over OTLP/HTTP, and the trace settings clients change at run time."""

from tritium.tracing.settings import TraceSettings
from tritium.tracing.tracer import ServerTracer

__all__ = ["ServerTracer", "TraceSettings"]
