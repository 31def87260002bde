"""Queue timeouts of one model: a heap of deadlines and one timer for the earliest."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from tritium.core.request import AdmittedRequest, RequestStage
from tritium.scheduling.clock import Alarm, Clock

ExpireCallback = Callable[[AdmittedRequest], None]


class Deadlines:
    """Calls ``on_expired`` for each request still queued when its deadline passes.

    Entries of requests that left the queue stay in the heap until they reach its top
    (lazy removal, as in the queue); the timer is armed for the earliest entry only, so
    its cost does not grow with the number of queued requests.
    """

    def __init__(self, clock: Clock, on_expired: ExpireCallback, on_fired: Callable[[], None]):
        self._clock = clock
        self._on_expired = on_expired
        self._on_fired = on_fired
        self._heap: list[tuple[int, int, AdmittedRequest]] = []
        self._order = itertools.count()
        self._alarm = Alarm(clock, self._fire)

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, request: AdmittedRequest, deadline_ns: int) -> None:
        heapq.heappush(self._heap, (deadline_ns, next(self._order), request))
        if self._heap[0][2] is request:
            self._alarm.arm(deadline_ns)

    def expire_due(self, now_ns: int) -> None:
        """Expire every queued request whose deadline is at or before ``now_ns``."""
        heap = self._heap
        while heap and heap[0][0] <= now_ns:
            _, _, request = heapq.heappop(heap)
            if request.stage is RequestStage.QUEUED:
                self._on_expired(request)
        self._drop_stale()

    def _drop_stale(self) -> None:
        heap = self._heap
        while heap and heap[0][2].stage is not RequestStage.QUEUED:
            heapq.heappop(heap)
        if heap:
            self._alarm.arm(heap[0][0])
        else:
            self._alarm.disarm()

    def _fire(self) -> None:
        self.expire_due(self._clock.now_ns())
        self._on_fired()
