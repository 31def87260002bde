"""What a version slot of the model manager holds, and what builds an ensemble's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from tritium.core.model import ModelHandle
from tritium.ensemble.plan import EnsemblePlan
from tritium.execution.kinds import InstanceBuilder


class ServedVersion(ModelHandle, Protocol):
    """What a version slot holds: a ``LoadedModel``, or an ensemble's handle."""

    load_seconds: float
    namespace: str  # its repository under --model-namespacing, else ""

    async def start(self, loop: asyncio.AbstractEventLoop, builder: InstanceBuilder
                    ) -> None: ...

    async def stop(self) -> None: ...

    def in_flight(self) -> int: ...

    def unavailable_reason(self) -> str | None:
        """Why a version that loaded can no longer serve (None: it can)."""

    def instances_up(self) -> bool:
        """Every instance of its own runs (strict readiness asks each instance)."""

    async def drain(self, timeout_s: float) -> int: ...


# Builds an ensemble version's handle from its plan, its completed config and its version.
EnsembleFactory = Callable[[EnsemblePlan, Any, int], ServedVersion]
