"""A traced request's tree: the frontend's trace (Triton's "InferRequest" span), one trace
per request to a model (its model span), and a compute span while the model runs it.

Where the records go is the mode's ``Sink`` (file.py: Triton's JSON trace file; otel.py:
OpenTelemetry spans). Children nest as in Triton: a BLS request under the compute span of
the request that made it, an ensemble step under the ensemble's model span.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable
from typing import Any, Protocol

from tritium.core.tracing import COMPUTE_END, COMPUTE_START, REQUEST_END, REQUEST_START
from tritium.core.types import Tensor

# Trace ids are the server's, as Triton numbers its traces: 1, 2, ... (next() on a count
# is atomic under the GIL, so threads may take them too).
_ids = itertools.count(1)

# Beyond Triton: what a cancellation adds (event names, attribute keys).
CANCEL_EVENT = "REQUEST_CANCELLED"
STOPPED_EVENT = "MODEL_STOPPED"
CANCEL_REASON = "tritium.cancel.reason"
CANCEL_STAGE = "tritium.cancel.stage"
STOP_DELAY = "tritium.cancel.stop_delay_us"


class Sink(Protocol):
    """Where one mode records a trace tree (spans are whatever the sink makes them)."""

    def start_root(self, root: RootTrace, ns: int) -> Any: ...

    def start_model(self, trace: ModelTrace, parent: Any, ns: int) -> Any: ...

    def start_compute(self, trace: ModelTrace, ns: int) -> Any: ...

    def event(self, trace: ModelTrace | RootTrace, span: Any, name: str, ns: int,
              attributes: dict[str, Any] | None = None) -> None: ...

    def end(self, span: Any, ns: int, error: str | None = None) -> None: ...

    def finished(self, root: RootTrace) -> None:
        """Every span of ``root``'s tree has ended."""

    def context(self, span: Any) -> str | None: ...

    def tensor(self, trace: ModelTrace, activity: str, tensor: Tensor) -> None:
        """Level TENSORS: one of the request's tensors at ``activity``."""


class WithoutTimestamps:
    """A sink for level TENSORS alone: spans and tensors, no timestamps."""

    def __init__(self, sink: Sink):
        self._sink = sink

    def event(self, trace: ModelTrace | RootTrace, span: Any, name: str, ns: int,
              attributes: dict[str, Any] | None = None) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sink, name)


class RootTrace:
    """The frontend's trace of a client's request (``core.tracing.FrontendTrace``)."""

    def __init__(self, sink: Sink, ns: int, context: Any = None, tensors: bool = False):
        self.sink = sink
        self.tensors = tensors  # level TENSORS: record the requests' tensors
        self.id = next(_ids)
        self.parent_context = context  # a W3C context the request carried, or None
        self.records: list[Any] = []  # the sink's, for modes that write whole trees
        self._open = 1  # spans not ended yet, this one included
        self._lock = threading.Lock()
        self._first = True  # the first model request shares the root's id, as in Triton
        self.span = sink.start_root(self, ns)

    def event(self, name: str, ns: int) -> None:
        self.sink.event(self, self.span, name, ns)

    def spawn(self, model_name: str, model_version: int, request_id: str, ns: int
              ) -> ModelTrace:
        trace_id = self.id if self._first else next(_ids)
        self._first = False
        return ModelTrace(self, trace_id, 0, self.span, model_name, model_version,
                          request_id, ns)

    def finish(self, ns: int) -> None:
        self.sink.end(self.span, ns)
        self.closed()

    def opened(self) -> None:
        with self._lock:
            self._open += 1

    def closed(self) -> None:
        with self._lock:
            self._open -= 1
            done = self._open == 0
        if done:
            self.sink.finished(self)


class ModelTrace:
    """One request to one model (``core.tracing.RequestTrace``)."""

    __slots__ = ("_cancelled_ns", "_pending_end", "_stop_expected", "compute", "id",
                 "model_name", "model_version", "parent_id", "request_id", "root", "span")

    def __init__(self, root: RootTrace, trace_id: int, parent_id: int, parent_span: Any,
                 model_name: str, model_version: int, request_id: str, ns: int):
        self.root = root
        self.id = trace_id
        self.parent_id = parent_id
        self.model_name = model_name
        self.model_version = model_version
        self.request_id = request_id
        self.compute: Any = None
        self._cancelled_ns = 0
        self._stop_expected = False  # decoupled: the model says when it stopped (FINAL)
        self._pending_end: tuple[str | None, int] | None = None
        root.opened()
        self.span = root.sink.start_model(self, parent_span, ns)
        root.sink.event(self, self.span, REQUEST_START, ns)

    def event(self, name: str, ns: int) -> None:
        sink = self.root.sink
        if name == COMPUTE_START:
            self.root.opened()
            self.compute = sink.start_compute(self, ns)
        if not name.startswith("COMPUTE_"):
            sink.event(self, self.span, name, ns)
            return
        compute = self.compute
        if compute is None:
            return
        if name != COMPUTE_END:
            sink.event(self, compute, name, ns)
            return
        self.compute = None
        if self._cancelled_ns:  # the model returned from a request cancelled meanwhile
            sink.event(self, compute, STOPPED_EVENT, ns,
                       {STOP_DELAY: max(ns - self._cancelled_ns, 0) // 1000})
        sink.event(self, compute, name, ns)
        sink.end(compute, ns)
        self.root.closed()

    def spawn(self, model_name: str, model_version: int, request_id: str, ns: int
              ) -> ModelTrace:
        # A BLS request is made while its parent computes; an ensemble's steps are not.
        parent = self.compute if self.compute is not None else self.span
        return ModelTrace(self.root, next(_ids), self.id, parent, model_name, model_version,
                          request_id, ns)

    def cancelled(self, reason: str, stage: str, ns: int) -> None:
        self._cancelled_ns = ns
        if stage != "executing":  # the model never got it: no FINAL will come
            self._stop_expected = False
        self.root.sink.event(self, self.span, CANCEL_EVENT, ns,
                             {CANCEL_REASON: reason, CANCEL_STAGE: stage})

    def expect_stop(self) -> None:
        """The model is decoupled: after a cancel, its FINAL (``stopped``) ends the span."""
        self._stop_expected = True

    def stopped(self, ns: int) -> None:
        """A decoupled model sent FINAL for this request after it was cancelled."""
        if not self._cancelled_ns:
            return
        sink = self.root.sink
        sink.event(self, self.span, STOPPED_EVENT, ns,
                   {STOP_DELAY: max(ns - self._cancelled_ns, 0) // 1000})
        self._stop_expected = False  # an ``end`` still to come ends the span at once
        pending, self._pending_end = self._pending_end, None
        if pending is not None:
            sink.end(self.span, ns, pending[0])
            self.root.closed()

    def end(self, error: str | None, ns: int) -> None:
        sink = self.root.sink
        sink.event(self, self.span, REQUEST_END, ns)
        if self._cancelled_ns and self._stop_expected:
            # The client was answered; the span lasts until the model stops.
            self._pending_end = (error, ns)
            return
        sink.end(self.span, ns, error)
        self.root.closed()

    def context(self) -> str | None:
        return self.root.sink.context(self.span)

    def tensors(self, activity: str, tensors: Iterable[Tensor]) -> None:
        if self.root.tensors:
            for tensor in tensors:
                self.root.sink.tensor(self, activity, tensor)
