"""An inference request as a frontend (or BLS) decoded it, and as the core admitted it."""

from __future__ import annotations

import enum
import operator
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from tritium.core.cancellation import Cancellation
from tritium.core.response import ResponseStream
from tritium.core.types import Tensor

ParamValue = str | int | float | bool

# Request flags, numbered as Triton numbers them.
SEQUENCE_START = 1
SEQUENCE_END = 2
# TRITONSERVER_RequestReleaseFlag: how a model lets go of a request it executed.
RELEASE_ALL = 1
RELEASE_RESCHEDULE = 2  # run it again (iterative sequences): it goes back to the queue


class RequestStage(enum.Enum):
    """Where an admitted request is; a cancellation acts according to it."""

    CREATED = "created"
    QUEUED = "queued"
    EXECUTING = "executing"
    DONE = "done"

    # Members are singletons: identity hashes in C, where Enum's own hash runs Python on
    # every move of every request.
    __hash__ = object.__hash__


# Every legal move; anything else is a scheduling bug. DONE is final: a request that
# left the queue cancelled or finished executing never runs again. EXECUTING -> QUEUED is
# a request its model released with RELEASE_RESCHEDULE.
_MOVES: dict[RequestStage, frozenset[RequestStage]] = {
    RequestStage.CREATED: frozenset({RequestStage.QUEUED}),
    RequestStage.QUEUED: frozenset({RequestStage.EXECUTING, RequestStage.DONE}),
    RequestStage.EXECUTING: frozenset({RequestStage.QUEUED, RequestStage.DONE}),
    RequestStage.DONE: frozenset(),
}


_CREATED = RequestStage.CREATED


class StageError(RuntimeError):
    """A request was moved between stages in a way the scheduler never does."""


@dataclass(slots=True)
class RequestedOutput:
    """An output the client asked for; ``parameters`` are the frontend's own options
    (for example HTTP ``binary_data``) and travel untouched."""

    name: str
    parameters: dict[str, ParamValue] = field(default_factory=dict)


_NAME = operator.attrgetter("name")


class InferenceRequest(msgspec.Struct, eq=False):
    """A request as a frontend (or BLS) decoded it; the core does not write to it, except
    that validation may reshape its input tensors and sequence batching adds control inputs.
    (A Struct: made in C, with no Python ``__init__`` frame, for every request.)"""

    model_name: str
    inputs: dict[str, Tensor]
    model_version: int | None = None  # as asked for; None: the version policy picks
    id: str = ""
    requested_outputs: list[RequestedOutput] | None = None  # None: every output
    parameters: dict[str, ParamValue] = msgspec.field(default_factory=dict)
    correlation_id: int | str = 0
    flags: int = 0
    priority: int = 0
    timeout_us: int = 0
    # Opaque slot a frontend may use to keep its own per-request state.
    frontend_state: Any = None
    # The model handle a frontend ran ``validation.check_input`` on for every input; the
    # core then skips those checks for that handle (and only for it).
    checked_for: Any = None
    # None unless traced: what the request is traced under (a frontend's trace, or the
    # parent request's for BLS and ensemble steps); once admitted, its own (core.tracing).
    trace: Any = None

    def requested_output_names(self) -> list[str] | None:
        if self.requested_outputs is None:
            return None
        return list(map(_NAME, self.requested_outputs))  # no comprehension frame per call

    def describe(self) -> str:
        """How logs and error messages name this request."""
        return self.id or "<id_unknown>"


class AdmittedRequest:
    """A request the core admitted: what scheduling, execution and the model work on.

    Made by ``InferenceService.submit``. ``stage`` changes only through ``move_to``.
    """

    __slots__ = ("_stage", "arrival_ns", "batch_size", "cancellation", "release_flags",
                 "request", "stream")

    def __init__(self, request: InferenceRequest, cancellation: Cancellation,
                 stream: ResponseStream, batch_size: int = 1, arrival_ns: int | None = None):
        self.request = request
        self.cancellation = cancellation
        # Where the model's responses go.
        self.stream = stream
        self.batch_size = batch_size  # the first dimension, when the model batches
        self.arrival_ns = time.monotonic_ns() if arrival_ns is None else arrival_ns
        self._stage = _CREATED
        # Set by the model during execute (``set_release_flags``); read when it returns.
        self.release_flags = RELEASE_ALL

    if TYPE_CHECKING:
        @property
        def stage(self) -> RequestStage:
            """Where the request is now."""
    else:
        # Read-only, and read on every scheduling step: a C getter costs no Python call.
        stage = property(operator.attrgetter("_stage"), doc="Where the request is now.")

    def move_to(self, stage: RequestStage) -> None:
        """The one place a stage changes; raises StageError for a move not in the table."""
        if stage not in _MOVES[self._stage]:
            raise StageError(
                f"request {self.request.describe()} cannot move from {self._stage.value} "
                f"to {stage.value}"
            )
        self._stage = stage

    def describe(self) -> str:
        return self.request.describe()

    def __repr__(self) -> str:
        return f"AdmittedRequest({self.request.describe()!r}, {self._stage.value})"
