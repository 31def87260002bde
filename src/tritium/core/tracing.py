"""What the core, the frontends and the backends call on a request's trace.

``tracing/`` implements these; ``server.py`` hands its tracer to the ``InferenceService``.
A request that is not traced carries ``trace = None``, so tracing off costs one attribute
test at each place a trace would record something.

Timestamps are ``time.monotonic_ns()``: Triton's trace file uses a steady clock too, and the
OpenTelemetry mode shifts them to the wall clock once, when it exports.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.logging_settings import TraceValue
from tritium.core.types import Tensor

if TYPE_CHECKING:
    from tritium.core.request import AdmittedRequest

# Triton's activity names (TRITONSERVER_InferenceTraceActivityString).
REQUEST_START = "REQUEST_START"
QUEUE_START = "QUEUE_START"
COMPUTE_START = "COMPUTE_START"
COMPUTE_INPUT_END = "COMPUTE_INPUT_END"
COMPUTE_OUTPUT_START = "COMPUTE_OUTPUT_START"
COMPUTE_END = "COMPUTE_END"
REQUEST_END = "REQUEST_END"
TENSOR_QUEUE_INPUT = "TENSOR_QUEUE_INPUT"
TENSOR_BACKEND_OUTPUT = "TENSOR_BACKEND_OUTPUT"


class RequestTrace(Protocol):
    """The trace of one request to one model: Triton's TRITONSERVER_InferenceTrace (a
    model span, and a compute span while the model runs it)."""

    def event(self, name: str, ns: int) -> None:
        """Record an activity (REQUEST_START ... REQUEST_END, COMPUTE_*) at ``ns``."""

    def spawn(self, model_name: str, model_version: int, request_id: str, ns: int
              ) -> RequestTrace:
        """The trace of a request this one makes (a BLS child, an ensemble step), its
        REQUEST_START recorded at ``ns``."""

    def cancelled(self, reason: str, stage: str, ns: int) -> None:
        """The request was cancelled (``reason``) while ``stage`` (queued, executing)."""

    def end(self, error: str | None, ns: int) -> None:
        """REQUEST_END: the request's final response was sent (``error``: its failure)."""

    def expect_stop(self) -> None:
        """The model is decoupled: after a cancel, ``stopped`` says when it stopped."""

    def stopped(self, ns: int) -> None:
        """The decoupled model sent its FINAL after the request was cancelled."""

    def context(self) -> str | None:
        """W3C trace context of the model span as JSON (pb_utils ``get_context()``), or
        None where the mode has none."""

    def tensors(self, activity: str, tensors: Iterable[Tensor]) -> None:
        """Level TENSORS: the request's tensors at ``activity`` (TENSOR_QUEUE_INPUT,
        TENSOR_BACKEND_OUTPUT); nothing at other levels."""


class FrontendTrace(Protocol):
    """The trace a frontend starts for a client's request (Triton's "InferRequest" span):
    the protocol's own timestamps, and the request to the model as its child."""

    def event(self, name: str, ns: int) -> None: ...

    def spawn(self, model_name: str, model_version: int, request_id: str, ns: int
              ) -> RequestTrace: ...

    def finish(self, ns: int) -> None:
        """The frontend is done with the request (its last byte was handed to the socket)."""


class Tracer(Protocol):
    """Decides which requests are traced, and holds the settings clients read and change."""

    enabled: bool  # False: no request is traced, frontends skip tracing altogether

    def start(self, model_name: str, carrier: Mapping[str, str] | None
              ) -> FrontendTrace | None:
        """A trace for a request to ``model_name`` when it is sampled (or carries a W3C
        ``traceparent`` in ``carrier`` where the mode honours one), else None."""

    def settings(self, model_name: str | None) -> dict[str, TraceValue]: ...

    def update(self, changes: Mapping[str, Any], model_name: str | None
               ) -> dict[str, TraceValue]: ...


class NoTracer:
    """The tracer of a service built without one (tests and tools; ``tritium serve`` always
    has one, tracing/): it traces nothing, answers Triton's defaults, and refuses changes."""

    enabled = False

    def start(self, model_name: str, carrier: Mapping[str, str] | None) -> None:
        return None

    def settings(self, model_name: str | None) -> dict[str, TraceValue]:
        return {"trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1",
                "log_frequency": "0", "trace_file": "", "trace_mode": "triton"}

    def update(self, changes: Mapping[str, Any], model_name: str | None
               ) -> dict[str, TraceValue]:
        raise TritiumError(ErrorCode.UNSUPPORTED,
                           "trace settings cannot be changed: this service has no tracer")


def traces_of(requests: Sequence[AdmittedRequest]) -> list[RequestTrace] | None:
    """The traces of the requests of a batch that are traced; None (the usual answer)
    when none is."""
    found: list[RequestTrace] | None = None
    for admitted in requests:
        trace = admitted.request.trace
        if trace is not None:
            if found is None:
                found = []
            found.append(trace)
    return found


def record(traces: list[RequestTrace], name: str, ns: int) -> None:
    for trace in traces:
        trace.event(name, ns)


# What a frontend records on its trace, per protocol: (when the request arrived, when it was
# read), (when the response began to go out, when it was handed to the socket).
HTTP_EVENTS = (("HTTP_RECV_START", "HTTP_RECV_END"), ("HTTP_SEND_START", "HTTP_SEND_END"))
GRPC_EVENTS = (("GRPC_WAITREAD_START", "GRPC_WAITREAD_END"),
               ("GRPC_SEND_START", "GRPC_SEND_END"))


def begin(tracer: Tracer, model_name: str, carrier: Mapping[str, str] | None,
          events: tuple[tuple[str, str], tuple[str, str]], received_ns: int | None = None
          ) -> FrontendTrace | None:
    """The frontend's trace of a request to ``model_name`` when it is traced, its receive
    timestamps recorded (``received_ns``: when the request arrived, if the frontend knows)."""
    trace = tracer.start(model_name, carrier)
    if trace is not None:
        now = time.monotonic_ns()
        trace.event(events[0][0], now if received_ns is None else received_ns)
        trace.event(events[0][1], now)
    return trace


def sending(trace: FrontendTrace, events: tuple[tuple[str, str], tuple[str, str]]) -> None:
    trace.event(events[1][0], time.monotonic_ns())


def finish(trace: FrontendTrace, events: tuple[tuple[str, str], tuple[str, str]],
           sent: bool) -> None:
    """The frontend is done; ``sent``: a response went out (its end is recorded)."""
    now = time.monotonic_ns()
    if sent:
        trace.event(events[1][1], now)
    trace.finish(now)
