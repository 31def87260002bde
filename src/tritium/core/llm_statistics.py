"""Statistics of text generation requests (OpenAI's API): requests by endpoint and outcome,
tokens, time to first token and inter-token latency, per model version. Frontends record,
``metrics/`` reads snapshots (from its render thread, hence the lock)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

# vLLM's bounds for both latencies, so dashboards built for it read ours unchanged.
LATENCY_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                     1.0, 2.5, 5.0, 7.5, 10.0)
OUTCOMES = ("success", "error", "cancelled")


@dataclass(slots=True)
class Histogram:
    """Observations per bucket (not cumulative), their sum and count."""

    bounds: tuple[float, ...] = LATENCY_BUCKETS_S
    counts: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS_S))
    total: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        self.total += value
        self.count += 1
        for index, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[index] += 1
                return

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations at or below it), +Inf last, as Prometheus has it."""
        running, pairs = 0, []
        for bound, count in zip(self.bounds, self.counts, strict=True):
            running += count
            pairs.append((bound, running))
        pairs.append((float("inf"), self.count))
        return pairs

    def copy(self) -> Histogram:
        return Histogram(self.bounds, list(self.counts), self.total, self.count)


@dataclass(slots=True)
class GenerationSnapshot:
    """A copy of one model version's numbers; ``requests`` counts (endpoint, outcome)."""

    requests: Counter[tuple[str, str]] = field(default_factory=Counter)
    prompt_tokens: int = 0
    generation_tokens: int = 0
    time_to_first_token: Histogram = field(default_factory=Histogram)
    inter_token_latency: Histogram = field(default_factory=Histogram)


class GenerationStatistics:
    """One model version's text generation statistics, kept in its ModelStatistics."""

    __slots__ = ("_figures", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._figures = GenerationSnapshot()

    def request(self, endpoint: str) -> GenerationTimer:
        return GenerationTimer(self, endpoint)

    def snapshot(self) -> GenerationSnapshot:
        with self._lock:
            f = self._figures
            return GenerationSnapshot(Counter(f.requests), f.prompt_tokens, f.generation_tokens,
                                      f.time_to_first_token.copy(),
                                      f.inter_token_latency.copy())

    def observe_step(self, first: bool, seconds: float) -> None:
        with self._lock:
            f = self._figures
            (f.time_to_first_token if first else f.inter_token_latency).observe(seconds)

    def count(self, endpoint: str, outcome: str, prompt_tokens: int,
              generation_tokens: int) -> None:
        with self._lock:
            f = self._figures
            f.requests[(endpoint, outcome)] += 1
            f.prompt_tokens += prompt_tokens
            f.generation_tokens += generation_tokens


class GenerationTimer:
    """One request's timing: each response with text is a step; the first one's delay
    from the start is the time to first token, each later one's from the one before is an
    inter-token latency."""

    __slots__ = ("_endpoint", "_finished", "_last", "_stats", "steps")

    def __init__(self, stats: GenerationStatistics, endpoint: str):
        self._stats = stats
        self._endpoint = endpoint
        self._last = time.perf_counter()
        self._finished = False
        self.steps = 0

    def step(self) -> None:
        now = time.perf_counter()
        self._stats.observe_step(self.steps == 0, now - self._last)
        self._last = now
        self.steps += 1

    def finish(self, outcome: str, prompt_tokens: int = 0, generation_tokens: int = 0) -> None:
        """Count the request once, whichever way it ended."""
        if self._finished:
            return
        self._finished = True
        self._stats.count(self._endpoint, outcome, prompt_tokens, generation_tokens)
