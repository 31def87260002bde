"""The dynamic batcher's decision: how many queued requests to execute now, or until when to wait.

Pure: it reads requests in queue order and a time, and returns a ``BatchPlan``; the
scheduler owns the queue and the timer. The rules follow Triton's dynamic batcher:

- requests join in queue order while their batch sizes (a request of batch 4 counts 4)
  fit under the largest preferred batch size, or ``max_batch_size`` without preferences;
  a request that does not fit closes the batch (order is never skipped over);
- a batch whose size equals a preferred size goes at once, cut at the largest preferred
  size reached;
- a batch that cannot grow any more goes at once;
- otherwise it waits until its oldest request has been queued ``max_queue_delay``, then
  goes as it is (with no delay configured it goes at once).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tritium.core.request import AdmittedRequest
from tritium.scheduling.policy import SchedulerPolicy


@dataclass(frozen=True, slots=True)
class BatchPlan:
    count: int  # requests to take from the front of the queue now; 0: none
    wait_until_ns: int = 0  # when count is 0 and requests wait: when to decide again


NOTHING = BatchPlan(0)


class Batcher:
    def __init__(self, policy: SchedulerPolicy):
        self.limit = policy.batch_limit()
        self.preferred = frozenset(policy.preferred_batch_sizes)
        self.delay_ns = policy.max_queue_delay_us * 1000

    def plan(self, queued: Iterable[AdmittedRequest], now_ns: int) -> BatchPlan:
        """Decide for the requests ``queued`` (live ones, in queue order) at ``now_ns``."""
        count = total = preferred_count = 0
        oldest_ns = now_ns
        can_grow = True
        for request in queued:
            size = max(request.batch_size, 1)
            if count and total + size > self.limit:
                can_grow = False
                break
            count += 1
            total += size
            oldest_ns = min(oldest_ns, request.arrival_ns)
            if total in self.preferred:
                preferred_count = count
            if total >= self.limit:
                can_grow = False
                break
        if count == 0:
            return NOTHING
        if preferred_count:
            return BatchPlan(preferred_count)
        if not can_grow or self.delay_ns == 0:
            return BatchPlan(count)
        due_ns = oldest_ns + self.delay_ns
        if now_ns >= due_ns:
            return BatchPlan(count)
        return BatchPlan(0, due_ns)
