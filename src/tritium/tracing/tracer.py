"""The server's tracer (``core.tracing.Tracer``): samples requests by the settings in force
and starts their trace in the configured mode."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from tritium.core.logging_settings import TraceValue
from tritium.tracing.control import TraceControl
from tritium.tracing.file import FileSink, TraceFile
from tritium.tracing.settings import TraceSettings
from tritium.tracing.trace import RootTrace, WithoutTimestamps

log = logging.getLogger("tritium.tracing")


class ServerTracer:
    """Tracing as ``--trace-config`` set it up; clients change level, rate, count and log
    frequency at run time. ``enabled`` is False while no setting traces anything, and the
    OpenTelemetry SDK is imported only when a request is first traced in that mode."""

    def __init__(self, settings: TraceSettings):
        self.startup = settings
        self.control = TraceControl(settings)
        self.enabled = self.control.any_tracing
        self._sink: Any = None
        self._otel: Any = None  # the module, once imported

    def start(self, model_name: str, carrier: Mapping[str, str] | None) -> RootTrace | None:
        context = None
        if carrier is not None and self.startup.mode == "opentelemetry" \
                and "traceparent" in carrier:
            context = self._otel_module().extract(carrier)
        sampler = self.control.sampler(model_name)
        if not sampler.sample(context is not None):
            return None
        sink = self._sink or self._open_sink()
        if sink is None:
            return None
        level = sampler.settings.level
        if "TIMESTAMPS" not in level:
            sink = WithoutTimestamps(sink)
        return RootTrace(sink, time.monotonic_ns(), context, tensors="TENSORS" in level)

    def settings(self, model_name: str | None) -> dict[str, TraceValue]:
        return self.control.current(model_name)

    def update(self, changes: Mapping[str, Any], model_name: str | None
               ) -> dict[str, TraceValue]:
        current = self.control.update(changes, model_name)
        self.enabled = self.control.any_tracing
        if isinstance(self._sink, FileSink):
            # Trees are written by the global frequency (Triton keeps one per setting).
            self._sink.file.log_frequency = int(str(self.control.current(None)
                                                    ["log_frequency"]))
        return current

    def close(self) -> None:
        """Write or export what was traced (blocking: run it off the event loop)."""
        if self._sink is not None:
            self._sink.close()

    def _open_sink(self) -> Any:
        settings = self.startup
        if settings.mode == "triton":
            if not settings.file:
                return None
            self._sink = FileSink(TraceFile(settings.file, settings.log_frequency))
        else:
            otel = self._otel_module()
            self._sink = otel.OtelSink(otel.provider_for(settings))
        return self._sink

    def _otel_module(self) -> Any:
        if self._otel is None:
            from tritium.tracing import otel

            self._otel = otel
        return self._otel
