"""The rate limiter (``--rate-limit execution_count``): which model instance may run next.

An instance its scheduler hands a batch to is *staged*: the batch waits here, formed, until
the resources the instance's group names are free (``resources``), then goes to the
instance, and the resources come back when ``execute`` returns. Staged instances of every
model are served in the order of their priority weighting, Triton's: the instance with the
fewest runs, each run counting its group's ``priority`` (0 counts as 1), goes first; equal
weightings go in the order they were staged. Only the first in that order may take
resources: one behind it waits even when what it needs is free, so a large need is not
starved by small ones.

Each instance is wrapped in a ``Gate``, which its scheduler uses as the instance. A request
cancelled while its batch waits here is answered at once by its cancellation, as any
request is, and the instance drops it unrun when the batch arrives. With ``--rate-limit off``
(the default) nothing here exists: schedulers hand batches to instances directly.

Loop only, like the schedulers that call it.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Callable
from typing import Any, Protocol

from tritium.core.request import AdmittedRequest
from tritium.core.response import ResponseStream
from tritium.scheduling.resources import ResourceNeed, ResourcePool

log = logging.getLogger("tritium.scheduler")

DoneCallback = Callable[[Any, list[AdmittedRequest], int, list[ResponseStream] | None], None]


class _Instance(Protocol):
    def submit(self, batch: list[AdmittedRequest]) -> None: ...


class Gate:
    """A model instance as its scheduler sees it under the rate limiter: ``submit`` stages
    it, and the end of its ``execute`` (``finished``, the instance's done callback) returns
    what it took and reports the batch done to ``target``."""

    def __init__(self, limiter: RateLimiter, name: str, priority: int):
        self.name = name
        self.instance: _Instance | None = None  # the instance, once built
        self.target: DoneCallback | None = None  # where finished batches go
        self.runs = 0  # executions that held resources
        self._weight = max(priority, 1)
        self._limiter = limiter
        self._held: list[AdmittedRequest] | None = None  # the staged batch
        self._running = False  # holds resources for a batch the instance runs
        self.removed = False

    @property
    def weighting(self) -> int:
        return self.runs * self._weight

    def submit(self, batch: list[AdmittedRequest]) -> None:
        if self.removed:
            self._hand_over(batch)
            return
        assert self._held is None and not self._running, "an instance runs one batch at a time"
        self._held = batch
        self._limiter.stage(self)

    def finished(self, instance: Any, batch: list[AdmittedRequest], exec_ns: int,
                 woken: list[ResponseStream] | None = None) -> None:
        ran = self._running  # False for warmup batches, which reach the instance directly
        if ran:
            self._running = False
            self.runs += 1
        assert self.target is not None
        # The scheduler first, as Triton stages a released instance that has work before it
        # allocates: this instance competes for what it gives back, by its new weighting.
        self.target(self, batch, exec_ns, woken)
        if ran:
            self._limiter.release(self)

    def run(self) -> None:
        """Resources taken: the staged batch goes to the instance."""
        batch, self._held = self._held, None
        assert batch is not None
        self._running = True
        self._hand_over(batch)

    def take_held(self) -> list[AdmittedRequest] | None:
        batch, self._held = self._held, None
        return batch

    def _hand_over(self, batch: list[AdmittedRequest]) -> None:
        assert self.instance is not None
        self.instance.submit(batch)


class RateLimiter:
    """Every loaded instance's needs and the instances staged, for the whole server."""

    def __init__(self, given: tuple[tuple[str, int, int], ...] = ()):
        self.pool = ResourcePool(given)
        self._staged: list[tuple[int, int, Gate]] = []  # a heap: weighting, order, gate
        self._order = itertools.count()
        self._allocating = False

    def gate(self, name: str, device: int, config: Any) -> Gate:
        """Register instance ``name`` on ``device`` with its group's ``rate_limiter``
        (``ModelRateLimiter``). Raises TritiumError when the resources cannot serve it."""
        gate = Gate(self, name, config.priority)
        needs = [ResourceNeed(r.name, r.count, getattr(r, "global"))
                 for r in config.resources]
        self.pool.add(gate, device, needs)
        if needs:
            log.debug("rate limiter: instance %s needs %s; pools now %s", name,
                      ", ".join(f"{n.name}:{n.count}" for n in needs), self.pool.limits())
        return gate

    def remove(self, gate: Gate) -> None:
        """Unregister ``gate`` (its model stops): a batch it holds goes to its instance,
        which drops the requests cancelled by then."""
        gate.removed = True
        self.pool.remove(gate)
        held = gate.take_held()
        if held is not None:
            gate.submit(held)
        self._allocate()

    def stage(self, gate: Gate) -> None:
        if not self._staged and not self._allocating and self.pool.try_take(gate):
            gate.run()  # first in line, and what it needs is free
            return
        heapq.heappush(self._staged, (gate.weighting, next(self._order), gate))
        self._allocate()

    def release(self, gate: Gate) -> None:
        self.pool.give_back(gate)
        if self._staged:
            self._allocate()

    def staged(self) -> list[str]:
        """The staged instances' names, first to run first."""
        return [gate.name for _, _, gate in sorted(self._staged)]

    def _allocate(self) -> None:
        # A gate that runs may finish at once (and stage again) only through the loop, but
        # an instance of a removed gate is handed its batch here: no re-entry either way.
        if self._allocating:
            return
        self._allocating = True
        try:
            staged = self._staged
            while staged:
                gate = staged[0][2]
                if gate.removed:
                    heapq.heappop(staged)
                    continue
                if not self.pool.try_take(gate):
                    return
                heapq.heappop(staged)
                gate.run()
        finally:
            self._allocating = False
