"""What the core needs from a loaded model and from the repository that holds models.

The core defines these interfaces; ``repository/``, ``scheduling/`` and ``execution/``
implement them and ``server.py`` wires the implementations in.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from tritium.core.errors import TritiumError
from tritium.core.request import AdmittedRequest
from tritium.core.response import ServedBy
from tritium.core.statistics import ModelStatistics
from tritium.core.types import TensorSpec


class ModelState(enum.Enum):
    UNKNOWN = "UNKNOWN"
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    UNLOADING = "UNLOADING"


@dataclass(frozen=True, slots=True)
class IndexEntry:
    name: str
    version: int | None
    state: ModelState
    reason: str = ""


@dataclass(frozen=True, slots=True)
class TensorMetadata:
    name: str
    datatype: str
    shape: list[int]


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata] = field(default_factory=list)
    outputs: list[TensorMetadata] = field(default_factory=list)


class ModelHandle(Protocol):
    """One loaded version of a model, ready to take requests."""

    name: str
    version: int
    platform: str
    decoupled: bool
    max_batch_size: int
    inputs: Mapping[str, TensorSpec]
    outputs: Mapping[str, TensorSpec]
    config: Any  # tritonclient's model_config_pb2.ModelConfig
    config_json: dict[str, Any]  # the same, in Triton's JSON form
    labels: dict[str, list[str]]  # an output's class labels, from its ``label_filename``
    served_by: ServedBy  # what its responses carry

    def is_ready(self) -> bool: ...

    def enqueue(self, request: AdmittedRequest) -> None:
        """Admit a validated request; raises TritiumError when it cannot be admitted."""

    def request_cancelled(self, request: AdmittedRequest) -> None:
        """Called on the loop after ``request.cancellation`` fired."""

    def request_finished(self, request: AdmittedRequest, error: TritiumError | None) -> None:
        """Called on the loop once the request's final response was sent."""

    def statistics(self) -> ModelStatistics: ...


class ModelRepository(Protocol):
    def resolve(self, name: str, version: int | None) -> ModelHandle:
        """The version to serve; raises TritiumError if there is none."""

    def resolve_member(self, key: str, version: int | None) -> ModelHandle:
        """``resolve`` for an ensemble's step: ``key`` may be one no request can name."""

    def ready_versions(self, name: str) -> list[int]: ...

    def index(self, ready_only: bool) -> list[IndexEntry]: ...

    def is_ready(self) -> bool:
        """True when every model that should be loaded is READY."""

    async def load(self, name: str, parameters: Mapping[str, Any]) -> None: ...

    async def unload(self, name: str, parameters: Mapping[str, Any]) -> None: ...
