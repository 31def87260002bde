"""An inference request as the core sees it, whichever frontend (or BLS) built it."""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tritium.core.cancellation import Cancellation
from tritium.core.response import ResponseStream
from tritium.core.types import Tensor

ParamValue = str | int | float | bool

# Request flags, numbered as Triton numbers them.
SEQUENCE_START = 1
SEQUENCE_END = 2


class RequestStage(enum.Enum):
    """Where a request is; a cancellation acts according to it."""

    CREATED = "created"
    QUEUED = "queued"
    EXECUTING = "executing"
    DONE = "done"


@dataclass(slots=True)
class RequestedOutput:
    """An output the client asked for; ``parameters`` are the frontend's own options
    (for example HTTP ``binary_data``) and travel untouched."""

    name: str
    parameters: dict[str, ParamValue] = field(default_factory=dict)


@dataclass(slots=True, eq=False)
class InferenceRequest:
    model_name: str
    inputs: dict[str, Tensor]
    # None: the version policy picks; set to the version serving it once admitted.
    model_version: int | None = None
    id: str = ""
    requested_outputs: list[RequestedOutput] | None = None  # None: every output
    parameters: dict[str, ParamValue] = field(default_factory=dict)
    correlation_id: int | str = 0
    flags: int = 0
    priority: int = 0
    timeout_us: int = 0
    # The caller's, attached by ``InferenceService.submit``.
    cancellation: Cancellation = field(init=False, repr=False)
    # Filled in by the core when the request is admitted.
    batch_size: int = 1
    batched: bool = False  # the model batches: the first dimension is the batch
    # The serving model's class labels per output (``label_filename``), for classification.
    labels: Mapping[str, Sequence[str]] | None = None
    # Made by a model (BLS), not by a client: still admitted while the server drains.
    internal: bool = False
    stage: RequestStage = RequestStage.CREATED
    # Where the model's responses go; set when the core admits the request.
    stream: ResponseStream | None = None
    arrival_ns: int = field(default_factory=time.monotonic_ns)
    # Opaque slot a frontend may use to keep its own per-request state.
    frontend_state: Any = None

    def requested_output_names(self) -> list[str] | None:
        if self.requested_outputs is None:
            return None
        return [output.name for output in self.requested_outputs]

    def describe(self) -> str:
        """How logs and error messages name this request."""
        return self.id or "<id_unknown>"
