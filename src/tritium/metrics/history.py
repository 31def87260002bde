"""The last minutes of each model's throughput and latency, for the live page: the
cumulative counters sampled once per metrics interval, turned into rates between samples."""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tritium.core.statistics import ModelStatistics

WINDOW_S = 300.0


@dataclass(frozen=True, slots=True)
class Sample:
    wall: float  # seconds since the epoch: what the page labels its time axis with
    successes: int
    success_ns: int
    failures: int


def sample_of(stats: ModelStatistics, wall: float) -> Sample:
    return Sample(wall, stats.success.count, stats.success.ns, sum(stats.failures.values()))


def rates(older: Sample, newer: Sample) -> dict[str, float]:
    """Requests per second (succeeded, failed) and the mean latency of the requests that
    succeeded between two samples (0 when none did)."""
    seconds = max(newer.wall - older.wall, 1e-9)
    done = newer.successes - older.successes
    spent_ns = newer.success_ns - older.success_ns
    return {
        "t": round(newer.wall, 3),
        "rps": round(done / seconds, 3),
        "errors_ps": round((newer.failures - older.failures) / seconds, 3),
        "latency_ms": round(spent_ns / done / 1e6, 3) if done > 0 else 0.0,
    }


class History:
    """Samples of every model version seen, kept for ``WINDOW_S``; a version that is no
    longer loaded is forgotten at the next sample."""

    def __init__(self, interval_s: float, window_s: float = WINDOW_S):
        self.window_s = window_s
        self._length = max(2, math.ceil(window_s / interval_s) + 1)
        self._samples: dict[tuple[str, int], deque[Sample]] = {}

    def sample(self, models: Iterable[Any], wall: float | None = None) -> None:
        """Runs on the event loop, where the statistics are written: a consistent read."""
        now = time.time() if wall is None else wall
        seen: dict[tuple[str, int], deque[Sample]] = {}
        for model in models:
            key = (model.name, model.version)
            samples = self._samples.get(key) or deque(maxlen=self._length)
            samples.append(sample_of(model.statistics(), now))
            seen[key] = samples
        self._samples = seen

    def series(self, name: str, version: int) -> list[dict[str, float]]:
        samples = list(self._samples.get((name, version), ()))
        return [rates(older, newer) for older, newer in itertools.pairwise(samples)]
