"""pb_utils.MetricFamily and Metric: custom model metrics, kept in memory for now.

The metrics layer is expected to read ``MetricFamily.families()`` to expose them.
"""

from __future__ import annotations

import enum
import threading
from typing import ClassVar


class MetricKind(enum.IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


class Metric:
    """One labelled series of a family."""

    def __init__(self, kind: MetricKind, labels: dict[str, str], buckets: list[float] | None):
        self.kind = kind
        self.labels = labels
        self.buckets = buckets
        self._lock = threading.Lock()
        self._value = 0.0
        self._count = 0

    def increment(self, value: float) -> None:
        if self.kind is MetricKind.HISTOGRAM:
            raise ValueError("increment() is not supported on a histogram metric")
        if self.kind is MetricKind.COUNTER and value < 0:
            raise ValueError("a counter cannot be incremented by a negative value")
        with self._lock:
            self._value += value

    def set(self, value: float) -> None:
        if self.kind is not MetricKind.GAUGE:
            raise ValueError("set() is only supported on a gauge metric")
        with self._lock:
            self._value = float(value)

    def observe(self, value: float) -> None:
        if self.kind is not MetricKind.HISTOGRAM:
            raise ValueError("observe() is only supported on a histogram metric")
        with self._lock:
            self._value += value
            self._count += 1

    def value(self) -> float:
        if self.kind is MetricKind.HISTOGRAM:
            raise ValueError("value() is not supported on a histogram metric")
        return self._value


class MetricFamily:
    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    _registry: ClassVar[dict[str, MetricFamily]] = {}
    _registry_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, name: str, description: str, kind: int) -> None:
        self.name = name
        self.description = description
        self.kind = MetricKind(kind)
        self.metrics: list[Metric] = []
        with self._registry_lock:
            self._registry[name] = self

    def Metric(
        self, labels: dict[str, str] | None = None, buckets: list[float] | None = None
    ) -> Metric:
        if self.kind is MetricKind.HISTOGRAM and buckets is None:
            raise ValueError("a histogram metric needs buckets")
        metric = Metric(self.kind, dict(labels or {}), buckets)
        self.metrics.append(metric)
        return metric

    @classmethod
    def families(cls) -> list[MetricFamily]:
        with cls._registry_lock:
            return list(cls._registry.values())
