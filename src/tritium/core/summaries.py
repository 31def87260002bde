"""Latency quantiles over a sliding time window, for the Prometheus summaries that
``--metrics-config summary_latencies=true`` adds.

The window is prometheus-cpp's summary window: observations of the last ``max_age``
(60 s), forgotten ``max_age / age_buckets`` (12 s) at a time. Each age bucket holds the
values observed while it was the newest, exactly while they are few and then as counts
per logarithmic value bucket, whose width bounds the relative error of a quantile. A
quantile is read over the buckets of the window merged: the value at its rank,
exactly, or within that relative error.

``arm`` hooks windows into a model's ``ModelStatistics`` by swapping its durations for
``ObservedDuration``s, so the request path is the same code whether summaries are on or
off: the scheduler's ``duration.ns += elapsed`` is what observes.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from tritium.core.statistics import Duration, ModelStatistics

MAX_AGE_S = 60.0
AGE_BUCKETS = 5
EXACT_LIMIT = 512  # values an age bucket keeps one by one before it counts them by bucket
MIN_RELATIVE_ERROR = 1e-4  # a finer sketch would cost memory for no visible difference
# The stages a summary is kept for, named as ModelStatistics names their durations.
STAGES = ("success", "queue", "compute_infer", "cache_hit", "cache_miss")


class AgeBucket:
    """The values observed during one age bucket's turn as the newest: the latest ones as
    they are (``values``), the rest counted per logarithmic value bucket."""

    __slots__ = ("counts", "folded", "values", "zeros")

    def __init__(self) -> None:
        self.values: list[int] = []  # the latest, at most EXACT_LIMIT
        self.counts: dict[int, int] = {}  # log bucket index -> values counted in it
        self.zeros = 0  # values counted that were <= 0 (under a microsecond)
        self.folded = 0  # values counted in ``counts`` and ``zeros``

    @property
    def total(self) -> int:
        return self.folded + len(self.values)


class QuantileWindow:
    """Quantiles of the values observed in the last ``max_age_s`` seconds, each within
    ``relative_error`` of the value at its rank. ``observe`` and ``quantiles`` may run on
    different threads."""

    def __init__(self, relative_error: float, max_age_s: float = MAX_AGE_S,
                 age_buckets: int = AGE_BUCKETS,
                 clock: Callable[[], float] = time.monotonic):
        alpha = min(max(relative_error, MIN_RELATIVE_ERROR), 0.5)
        self._gamma = (1 + alpha) / (1 - alpha)
        self._log_gamma = math.log(self._gamma)
        self._turn_s = max_age_s / age_buckets
        self._clock = clock
        self._buckets = [AgeBucket() for _ in range(age_buckets)]
        self._newest = 0
        self._turn_ends = clock() + self._turn_s
        self._lock = threading.Lock()

    def observe(self, value: int) -> None:
        # One frame and an append per request-path call: the counting is done EXACT_LIMIT
        # values at a time.
        with self._lock:
            now = self._clock()
            if now >= self._turn_ends:
                self._rotate(now)
            bucket = self._buckets[self._newest]
            values = bucket.values
            values.append(value)
            if len(values) > EXACT_LIMIT:
                self._fold(bucket)

    def _fold(self, bucket: AgeBucket) -> None:
        """Count ``bucket``'s latest values by log bucket."""
        bucket.zeros += self._count_into(bucket.counts, bucket.values)
        bucket.folded += len(bucket.values)
        bucket.values = []

    def _count_into(self, counts: dict[int, int], values: list[int]) -> int:
        """Add each of ``values`` to the count of its log bucket; how many were <= 0.
        (In numpy: a value at a time in Python cost the request path ~0.3 µs a value.)"""
        if not values:
            return 0
        found = np.asarray(values, dtype=np.float64)
        positive = found[found > 0]
        indices, hits = np.unique(np.ceil(np.log(positive) / self._log_gamma),
                                  return_counts=True)
        for index, count in zip(indices.astype(np.int64).tolist(), hits.tolist(),
                                strict=True):
            counts[index] = counts.get(index, 0) + count
        return len(found) - len(positive)

    def quantiles(self, wanted: Sequence[float]) -> list[float]:
        """Each quantile of ``wanted`` over the window; NaN for each when it is empty."""
        with self._lock:
            now = self._clock()
            if now >= self._turn_ends:
                self._rotate(now)
            buckets = [b for b in self._buckets if b.total]
            if not buckets:
                return [math.nan] * len(wanted)
            if not any(b.folded for b in buckets):  # few enough: exact
                values = sorted(v for b in buckets for v in b.values)
                return [float(values[_rank(q, len(values)) - 1]) for q in wanted]
            zeros, counts = self._merged(buckets)
        return [self._from_counts(q, zeros, counts) for q in wanted]

    def _rotate(self, now: float) -> None:
        """Forget the oldest age buckets: one per turn that ended since the last rotation."""
        ended = int((now - self._turn_ends) // self._turn_s) + 1
        for _ in range(min(ended, len(self._buckets))):
            self._newest = (self._newest + 1) % len(self._buckets)
            self._buckets[self._newest] = AgeBucket()
        self._turn_ends += ended * self._turn_s

    def _merged(self, buckets: list[AgeBucket]) -> tuple[int, list[tuple[int, int]]]:
        zeros = 0
        counts: dict[int, int] = {}
        for bucket in buckets:
            zeros += bucket.zeros
            for index, count in bucket.counts.items():
                counts[index] = counts.get(index, 0) + count
            zeros += self._count_into(counts, bucket.values)
        return zeros, sorted(counts.items())

    def _from_counts(self, q: float, zeros: int, counts: list[tuple[int, int]]) -> float:
        total = zeros + sum(count for _, count in counts)
        rank = _rank(q, total)
        if rank <= zeros:
            return 0.0
        seen = zeros
        for index, count in counts:
            seen += count
            if seen >= rank:
                # The point of bucket (gamma^(i-1), gamma^i] within alpha of both ends.
                return 2 * self._gamma ** index / (self._gamma + 1)
        raise AssertionError("unreachable: the last bucket holds the highest rank")


def _rank(q: float, total: int) -> int:
    """The 1-based rank of quantile ``q`` among ``total`` values (nearest rank)."""
    return min(max(math.ceil(q * total), 1), total)


class ObservedDuration(Duration):
    """A ``Duration`` whose every addition to ``ns`` is also observed, in microseconds, by
    ``window``: what the summaries' quantiles are read from."""

    __slots__ = ("_ns", "window")

    def __init__(self, window: QuantileWindow, count: int = 0, ns: int = 0):
        self.count = count
        self._ns = ns
        self.window = window

    @property
    def ns(self) -> int:
        return self._ns

    @ns.setter
    def ns(self, value: int) -> None:
        self.window.observe((value - self._ns) // 1000)
        self._ns = value


def arm(stats: ModelStatistics, quantiles: Sequence[tuple[float, float]],
        cached: bool) -> None:
    """Observe ``stats``'s latencies from now on, as Triton keeps its summaries: request
    durations only for a model without a response cache, cache hits and misses only for
    one with it (Triton leaves a cached model's request summary out as misleading)."""
    error = min(err for _, err in quantiles)
    stages = [s for s in STAGES
              if (s == "success" and not cached) or s in ("queue", "compute_infer")
              or (cached and s in ("cache_hit", "cache_miss"))]
    for stage in stages:
        window = QuantileWindow(error)
        if stage == "compute_infer":
            stats.compute_window = window
            for size, timing in list(stats.batches.items()):
                stats.batches[size] = ObservedDuration(window, timing.count, timing.ns)
            continue
        old: Duration = getattr(stats, stage)
        setattr(stats, stage, ObservedDuration(window, old.count, old.ns))


def window_of(stats: ModelStatistics, stage: str) -> QuantileWindow | None:
    """The window ``arm`` gave ``stage`` of ``stats``; None where it is not observed."""
    if stage == "compute_infer":
        return stats.compute_window
    duration = getattr(stats, stage)
    return duration.window if isinstance(duration, ObservedDuration) else None
