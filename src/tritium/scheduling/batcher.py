"""The dynamic batcher's decision: how many queued requests to execute now, or until when to wait.

Pure: it reads requests in queue order and a time, and returns a ``BatchPlan``; the
scheduler owns the queue and the timer. The rules follow Triton's dynamic batcher:

- requests join in queue order while their batch sizes (a request of batch 4 counts 4)
  fit under the largest preferred batch size, or ``max_batch_size`` without preferences;
  a request that does not fit closes the batch (order is never skipped over);
- so does a request whose shape differs from the batch's first request in an input with
  a variable dimension that does not ``allow_ragged_batch``, or, for a model with optional
  inputs, one that carries other inputs;
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
from tritium.core.types import Tensor
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
        self._inputs = EqualInputs.of(policy)

    def plan(self, queued: Iterable[AdmittedRequest], now_ns: int) -> BatchPlan:
        """Decide for the requests ``queued`` (live ones, in queue order) at ``now_ns``."""
        count = total = preferred_count = 0
        oldest_ns = now_ns
        can_grow = True
        inputs, first = self._inputs, None
        for request in queued:
            size = max(request.batch_size, 1)
            if count and total + size > self.limit:
                can_grow = False
                break
            if inputs is not None:
                if first is None:
                    first = request.request.inputs
                elif not inputs.fits(first, request.request.inputs):
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


class EqualInputs:
    """Triton's RequiredEqualInputs: what the requests of one batch must share."""

    def __init__(self, names: tuple[str, ...], same_inputs: bool):
        self._names = names
        self._same_inputs = same_inputs

    @classmethod
    def of(cls, policy: SchedulerPolicy) -> EqualInputs | None:
        """The rule of a model, or None when it has nothing to compare."""
        if not policy.equal_shape_inputs and not policy.optional_inputs:
            return None
        return cls(policy.equal_shape_inputs, policy.optional_inputs)

    def fits(self, first: dict[str, Tensor], inputs: dict[str, Tensor]) -> bool:
        """Whether a request with ``inputs`` may join a batch begun by ``first`` (shapes
        compared without the batch dimension)."""
        if self._same_inputs and inputs.keys() != first.keys():
            return False
        for name in self._names:
            mine, theirs = inputs.get(name), first.get(name)
            if mine is not None and theirs is not None and mine.shape[1:] != theirs.shape[1:]:
                return False
        return True
