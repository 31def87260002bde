"""Counters a model keeps (its scheduler writes them); metrics and stats endpoints read them."""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tritium.core.llm_statistics import GenerationStatistics

if TYPE_CHECKING:
    from tritium.core.summaries import QuantileWindow


@dataclass(slots=True)
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int) -> None:
        self.count += 1
        self.ns += ns


STOP_BUCKETS_MS = (1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 1000.0, 5000.0)
# Cancellations a model remembers one by one (for the live page); older ones are only counted.
RECENT_CANCELLATIONS = 32


@dataclass(slots=True)
class CancelRecord:
    """One cancellation as the live page lists it; ``stop_ms`` stays None until the work
    stopped (or for good, where the model never reports it: an ensemble's)."""

    request_id: str
    reason: str
    stage: str
    cancelled_at_ns: int  # the Cancellation's monotonic time: what a stop is matched by
    wall_time: float = field(default_factory=time.time)
    stop_ms: float | None = None


@dataclass(slots=True)
class ModelStatistics:
    """Cumulative figures for one model version, in Triton's terms."""

    inference_count: int = 0  # batch elements of successful requests
    last_inference_ms: int = 0
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    # Response cache: hits (lookup time) and stored misses (lookup and insert time).
    cache_hit: Duration = field(default_factory=Duration)
    cache_miss: Duration = field(default_factory=Duration)
    # (reason name) -> count, reasons as Triton's failure metric spells them
    failures: Counter[str] = field(default_factory=Counter)
    # (reason, stage) -> count: tritium's own cancellation figures
    cancellations: Counter[tuple[str, str]] = field(default_factory=Counter)
    # batch size -> Duration of compute_infer for that size: what execute() calls are
    # recorded in, once each; the totals (``execution_count``, ``compute_*``) are summed
    # from it when read, which is rare next to recording.
    batches: dict[int, Duration] = field(default_factory=dict)
    # cancel requested -> work stopped (execute() returned, or FINAL for decoupled models)
    cancel_stop: Duration = field(default_factory=Duration)
    cancel_stop_buckets: list[int] = field(default_factory=lambda: [0] * len(STOP_BUCKETS_MS))
    pending: int = 0  # admitted, not yet handed to an instance (the queue length)
    executing: int = 0  # handed to an instance, not yet finished
    # queue timeouts by the action taken ("REJECT" or "DELAY")
    expired: Counter[str] = field(default_factory=Counter)
    # requests per execute() call -> how many calls had that many (batch sizes are in
    # ``batches``: a request of batch 4 counts 4 there and 1 here)
    batch_requests: Counter[int] = field(default_factory=Counter)
    # text generation (OpenAI API) requests, tokens and latencies; frontends record them
    generation: GenerationStatistics = field(default_factory=GenerationStatistics)
    recent_cancellations: deque[CancelRecord] = field(
        default_factory=lambda: deque(maxlen=RECENT_CANCELLATIONS))
    # compute_infer's summary window (``summaries.arm``); None: no summaries
    compute_window: QuantileWindow | None = None

    def record_execution(self, batch_size: int, requests: int, compute_ns: int) -> None:
        """One execute() call over ``requests`` requests holding ``batch_size`` batch
        elements, its compute taking ``compute_ns``."""
        timing = self.batches.get(batch_size)
        if timing is None:
            timing = self.batches[batch_size] = self._new_timing()
        timing.count += 1
        timing.ns += compute_ns
        self.batch_requests[requests] += 1

    def _new_timing(self) -> Duration:
        # Once per batch size, so the summaries' window costs no check per request.
        if self.compute_window is None:
            return Duration()
        from tritium.core.summaries import ObservedDuration
        return ObservedDuration(self.compute_window)

    @property
    def compute_infer(self) -> Duration:
        """Every execute() call and its compute time."""
        total = Duration()
        # A list first: a reader on another thread may find a batch size being added.
        for timing in list(self.batches.values()):
            total.count += timing.count
            total.ns += timing.ns
        return total

    @property
    def execution_count(self) -> int:
        """execute() calls."""
        return sum(timing.count for timing in list(self.batches.values()))

    @property
    def compute_input(self) -> Duration:
        """Input handling happens inside execute(), so it counts once per call (clients
        such as perf_analyzer expect equal counts) as 0 ns; so does output handling."""
        return Duration(self.execution_count)

    @property
    def compute_output(self) -> Duration:
        """See ``compute_input``."""
        return Duration(self.execution_count)

    def record_cancel(self, request_id: str, reason: str, stage: str,
                      cancelled_at_ns: int) -> None:
        self.cancellations[(reason, stage)] += 1
        self.recent_cancellations.append(CancelRecord(request_id, reason, stage, cancelled_at_ns))

    def record_cancel_stop(self, delay_ns: int, cancelled_at_ns: int = 0) -> None:
        self.cancel_stop.add(delay_ns)
        self._note_stop(delay_ns, cancelled_at_ns)
        delay_ms = delay_ns / 1e6
        for index, bound in enumerate(STOP_BUCKETS_MS):
            if delay_ms <= bound:
                self.cancel_stop_buckets[index] += 1

    def _note_stop(self, delay_ns: int, cancelled_at_ns: int) -> None:
        # Newest first: the request that stopped was most likely cancelled last. Requests
        # sharing a cancellation (a parent's BLS children) take the records in turn.
        for record in reversed(self.recent_cancellations):
            if record.cancelled_at_ns == cancelled_at_ns and record.stop_ms is None:
                record.stop_ms = delay_ns / 1e6
                return
