"""The time from a request's arrival to its first response, as Triton's
``nv_inference_first_response_histogram_ms`` counts it (``--metrics-config
histogram_latencies=true``): whole milliseconds, per model version, in buckets a model's
config.pbtxt may choose (``model_metrics.metric_control``)."""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

log = logging.getLogger("tritium.metrics")

FAMILY = "nv_inference_first_response_histogram_ms"
DEFAULT_BUCKETS_MS = (100.0, 500.0, 2000.0, 5000.0)


class FirstResponseHistogram:
    """Observed from whichever thread sends a response; read by the metrics renderer."""

    def __init__(self, bounds: Sequence[float] = DEFAULT_BUCKETS_MS):
        self.bounds = tuple(sorted(bounds))
        self._counts = [0] * (len(self.bounds) + 1)  # per bucket, the last one +Inf
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe_since(self, arrival_ns: int) -> None:
        """A request that arrived at ``arrival_ns`` (monotonic) sent its first response."""
        # Whole milliseconds, as Triton divides nanoseconds by an integer.
        self.observe((time.monotonic_ns() - arrival_ns) // 1_000_000)

    def observe(self, ms: float) -> None:
        index = bisect.bisect_left(self.bounds, ms)  # a bucket holds values <= its bound
        with self._lock:
            self._counts[index] += 1
            self._sum += ms

    def snapshot(self) -> tuple[list[int], float]:
        """The cumulative count at each bound then +Inf (the total), and the sum."""
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, running = [], 0
        for count in counts:
            running += count
            cumulative.append(running)
        return cumulative, total


def configured_buckets(config: Any, model: str) -> tuple[float, ...]:
    """The bounds a model's config.pbtxt sets for the histogram, or the default. A family
    it names that is not a customizable one is warned about and ignored, as in Triton."""
    bounds: tuple[float, ...] = DEFAULT_BUCKETS_MS
    for control in config.model_metrics.metric_control:
        family = control.metric_identifier.family
        if family == FAMILY:
            bounds = tuple(control.histogram_options.buckets)
        else:
            log.warning("model '%s': Metric family '%s' in 'metric_identifier' is not a "
                        "customizable metric in Triton core.", model, family)
    return bounds
