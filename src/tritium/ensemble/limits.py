"""Triton's ``ensemble_scheduling.max_inflight_requests``: at most that many requests of each
step in flight at once, across every request of the ensemble (0: no limit).

A step over the limit waits its turn, in order, instead of flooding its model's queue: what
keeps a fast decoupled step from queueing unbounded work for a slower one after it. Loop
only. A start that is no longer wanted (its request ended meanwhile) gives its slot back.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

# Starts the step; False when it did not (so the slot is free again).
Start = Callable[[], bool]


class StepLimits:
    def __init__(self, steps: int, limit: int):
        self.limit = limit
        self._running = [0] * steps
        self._waiting: list[collections.deque[Start]] = [collections.deque()
                                                          for _ in range(steps)]

    def acquire(self, step: int, start: Start) -> None:
        """Run ``start`` now if ``step`` has room, else once a running one is released."""
        if self.limit <= 0:
            start()
            return
        if self._running[step] < self.limit:
            self._running[step] += 1
            if not start():
                self.release(step)
            return
        self._waiting[step].append(start)

    def release(self, step: int) -> None:
        """One request of ``step`` finished: start waiting ones while there is room."""
        if self.limit <= 0:
            return
        self._running[step] -= 1
        waiting = self._waiting[step]
        while waiting and self._running[step] < self.limit:
            start = waiting.popleft()
            self._running[step] += 1
            if not start():
                self._running[step] -= 1

    def running(self, step: int) -> int:
        return self._running[step]

    def waiting(self, step: int) -> int:
        return len(self._waiting[step])
