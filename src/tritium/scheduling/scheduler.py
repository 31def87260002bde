"""Per-model scheduler: admits requests, queues them, hands batches to free instances.

Runs on the event loop only. Instances report back through ``batch_done`` (scheduled
onto the loop by ``execution/``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.request import InferenceRequest, RequestStage
from tritium.scheduling.queue import RequestQueue
from tritium.scheduling.statistics import Duration, ModelStatistics

log = logging.getLogger("tritium.scheduler")


class Instance(Protocol):
    name: str

    def submit(self, batch: list[InferenceRequest]) -> None: ...


@dataclass(frozen=True, slots=True)
class SchedulerPolicy:
    """What config.pbtxt says about scheduling a model."""

    max_batch_size: int = 0
    dynamic_batching: bool = False
    max_queue_delay_us: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_size: int = 0  # 0: unbounded
    priority_levels: int = 0
    default_priority: int = 0


class ModelScheduler:
    def __init__(self, model_name: str, version: int, policy: SchedulerPolicy,
                 decoupled: bool = False):
        self.model_name = model_name
        self.decoupled = decoupled
        self.version = version
        self.policy = policy
        self.stats = ModelStatistics()
        self.accepting = True
        self._queue = RequestQueue(policy.priority_levels, policy.default_priority)
        self._idle: list[Instance] = []

    # -- instances ---------------------------------------------------------------
    def add_instances(self, instances: Sequence[Instance]) -> None:
        self._idle.extend(instances)
        self._dispatch()

    def batch_done(self, instance: Instance, batch: list[InferenceRequest], exec_ns: int) -> None:
        """An instance finished ``execute`` for ``batch`` (in ``exec_ns``) and can take more."""
        size = 0
        stats = self.stats
        now = time.monotonic_ns()
        for request in batch:
            size += request.batch_size
            if request.stage is RequestStage.EXECUTING:
                request.stage = RequestStage.DONE
            cancelled_at = request.cancellation.cancelled_at_ns
            if cancelled_at and not self.decoupled:
                stats.record_cancel_stop(now - cancelled_at)
        stats.executing -= len(batch)
        if exec_ns >= 0:
            stats.execution_count += 1
            stats.compute_infer.add(exec_ns)
            stats.batches.setdefault(size, Duration()).add(exec_ns)
        self._idle.append(instance)
        self._dispatch()

    # -- requests ----------------------------------------------------------------
    def enqueue(self, request: InferenceRequest) -> None:
        if not self.accepting:
            raise TritiumError(
                ErrorCode.UNAVAILABLE,
                f"model '{self.model_name}' version {self.version} is not accepting new "
                "requests",
            )
        limit = self.policy.max_queue_size
        if limit and len(self._queue) >= limit:
            self.stats.failures["REJECTED"] += 1
            raise TritiumError(ErrorCode.UNAVAILABLE, "Exceeds maximum queue size")
        self._queue.push(request)
        self.stats.pending += 1
        if self._idle:
            self._dispatch()

    def request_cancelled(self, request: InferenceRequest) -> None:
        reason = request.cancellation.reason
        reason_name = reason.name if reason else "UNKNOWN"
        if self._queue.discard(request):
            stage = "queued"
            self.stats.pending -= 1
        elif request.stage is RequestStage.EXECUTING and not _finished(request):
            stage = "executing"
        else:
            return
        self.stats.cancellations[(reason_name, stage)] += 1
        log.info(
            "request %s for model '%s' version %d cancelled while %s: %s",
            request.describe(), self.model_name, self.version, stage,
            reason.value if reason else "unknown",
        )

    def model_stopped(self, request: InferenceRequest) -> None:
        """A decoupled model sent FINAL for a request after it was cancelled."""
        cancelled_at = request.cancellation.cancelled_at_ns
        if cancelled_at:
            self.stats.record_cancel_stop(time.monotonic_ns() - cancelled_at)

    def request_finished(self, request: InferenceRequest, error: TritiumError | None) -> None:
        """Count the outcome once the request's final response was sent."""
        stats = self.stats
        elapsed = time.monotonic_ns() - request.arrival_ns
        if request.cancellation.is_cancelled():
            stats.failures["CANCELED"] += 1
            stats.fail.add(elapsed)
        elif error is not None:
            stats.failures["BACKEND"] += 1
            stats.fail.add(elapsed)
        else:
            stats.success.add(elapsed)
            stats.inference_count += request.batch_size
            stats.last_inference_ms = time.time_ns() // 1_000_000

    def _dispatch(self) -> None:
        queue = self._queue
        while self._idle and len(queue):
            batch = self._next_batch()
            if not batch:
                return
            now = time.monotonic_ns()
            for request in batch:
                request.stage = RequestStage.EXECUTING
                self.stats.queue.add(now - request.arrival_ns)
            self.stats.pending -= len(batch)
            self.stats.executing += len(batch)
            self._idle.pop().submit(batch)

    def _next_batch(self) -> list[InferenceRequest]:
        first = self._queue.pop()
        if first is None:
            return []
        batch = [first]
        if not self.policy.dynamic_batching:
            return batch
        total = first.batch_size
        limit = max(self.policy.max_batch_size, 1)
        while (nxt := self._queue.peek()) is not None and total + nxt.batch_size <= limit:
            self._queue.pop()
            batch.append(nxt)
            total += nxt.batch_size
        return batch

    # -- lifecycle ---------------------------------------------------------------
    def stop_accepting(self) -> None:
        self.accepting = False

    def is_idle(self) -> bool:
        return self.stats.pending == 0 and self.stats.executing == 0


def _finished(request: InferenceRequest) -> bool:
    stream = request.stream
    return stream is not None and stream.closed
