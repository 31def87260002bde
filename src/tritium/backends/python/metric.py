"""pb_utils.MetricFamily and Metric: custom model metrics, read by the metrics endpoint.

Families live in one process-wide registry keyed by name: a second family with the same
name, description and kind shares the first one's series, and ``Metric(labels=...)`` with
labels already in use returns that series, so /metrics never shows a series twice.
Models update metrics from their instance threads and the endpoint reads them from its own,
so every read and write holds the metric's lock; exporters read ``snapshot()``s.
"""

from __future__ import annotations

import bisect
import enum
import itertools
import math
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

# Prometheus's (pre-UTF-8) naming rules, as prometheus-client enforces them.
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# Histogram samples carry "le" themselves; "__" names are reserved for Prometheus.
_HISTOGRAM_LABEL = "le"


class MetricKind(enum.IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2

    @property
    def type_name(self) -> str:
        """The Prometheus type: "counter", "gauge" or "histogram"."""
        return self.name.lower()


@dataclass(frozen=True, slots=True)
class SeriesSnapshot:
    """One series at one moment. Histograms: ``value`` is the sum of observations and
    ``buckets`` the cumulative (upper bound, count) pairs, ending with +Inf."""

    labels: dict[str, str]
    value: float
    count: int = 0
    buckets: tuple[tuple[float, int], ...] = ()


@dataclass(frozen=True, slots=True)
class FamilySnapshot:
    name: str
    description: str
    kind: str
    series: tuple[SeriesSnapshot, ...]


def _check_labels(labels: dict[str, str], kind: MetricKind) -> dict[str, str]:
    for key, value in labels.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"metric labels must map str to str, got {key!r}: {value!r}")
        if not _LABEL_NAME.fullmatch(key) or key.startswith("__"):
            raise ValueError(f"invalid metric label name {key!r}")
        if kind is MetricKind.HISTOGRAM and key == _HISTOGRAM_LABEL:
            raise ValueError(f"label {key!r} is reserved on a histogram metric")
    return dict(labels)


def _bucket_bounds(buckets: Iterable[float]) -> tuple[float, ...]:
    """Finite upper bounds, strictly increasing; +Inf is always the implicit last bucket."""
    bounds = [float(b) for b in buckets]
    if bounds and bounds[-1] == math.inf:
        bounds.pop()
    if any(math.isnan(b) or math.isinf(b) for b in bounds):
        raise ValueError(f"histogram buckets must be finite (+Inf only last): {bounds}")
    if any(a >= b for a, b in itertools.pairwise(bounds)):
        raise ValueError(f"histogram buckets must be strictly increasing: {bounds}")
    return tuple(bounds)


class Metric:
    """One labelled series of a family."""

    def __init__(self, kind: MetricKind, labels: dict[str, str], buckets: list[float] | None):
        self.kind = kind
        self.labels = labels
        self.buckets = buckets
        self._bounds = _bucket_bounds(buckets or ())
        self._lock = threading.Lock()
        self._value = 0.0  # the counter or gauge value; a histogram's sum
        self._count = 0
        # Per bucket, not cumulative; the last one is +Inf.
        self._bucket_counts = [0] * (len(self._bounds) + 1)

    def increment(self, value: float) -> None:
        if self.kind is MetricKind.HISTOGRAM:
            raise ValueError("increment() is not supported on a histogram metric")
        if self.kind is MetricKind.COUNTER and value < 0:
            raise ValueError("a counter cannot be incremented by a negative value")
        with self._lock:
            self._value += float(value)

    def set(self, value: float) -> None:
        if self.kind is not MetricKind.GAUGE:
            raise ValueError("set() is only supported on a gauge metric")
        with self._lock:
            self._value = float(value)

    def observe(self, value: float) -> None:
        if self.kind is not MetricKind.HISTOGRAM:
            raise ValueError("observe() is only supported on a histogram metric")
        value = float(value)
        # "le" buckets: a value equal to a bound belongs to that bound's bucket.
        index = len(self._bounds) if math.isnan(value) else bisect.bisect_left(self._bounds, value)
        with self._lock:
            self._bucket_counts[index] += 1
            self._value += value
            self._count += 1

    def value(self) -> float:
        if self.kind is MetricKind.HISTOGRAM:
            raise ValueError("value() is not supported on a histogram metric")
        with self._lock:
            return self._value

    def snapshot(self) -> SeriesSnapshot:
        with self._lock:
            value, count, counts = self._value, self._count, list(self._bucket_counts)
        if self.kind is not MetricKind.HISTOGRAM:
            return SeriesSnapshot(dict(self.labels), value)
        cumulative, total = [], 0
        for bound, n in zip((*self._bounds, math.inf), counts, strict=True):
            total += n
            cumulative.append((bound, total))
        return SeriesSnapshot(dict(self.labels), value, count, tuple(cumulative))


class MetricFamily:
    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    _registry: ClassVar[dict[str, MetricFamily]] = {}
    _registry_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, name: str, description: str, kind: int) -> None:
        if not isinstance(name, str) or not _METRIC_NAME.fullmatch(name):
            raise ValueError(f"invalid metric family name {name!r}: it must match "
                             f"{_METRIC_NAME.pattern}")
        if not isinstance(description, str):
            raise TypeError(f"metric family description must be a str, got {description!r}")
        try:
            self.kind = MetricKind(kind)
        except ValueError:
            raise ValueError(f"invalid metric family kind {kind!r}: use MetricFamily.COUNTER, "
                             "GAUGE or HISTOGRAM") from None
        self.name = name
        self.description = description
        self._series: dict[tuple[tuple[str, str], ...], Metric] = {}
        self._lock = threading.Lock()
        with self._registry_lock:
            self._join(self._registry.setdefault(name, self))

    def _join(self, first: MetricFamily) -> None:
        """Share the series of the family first registered under this name."""
        if first is self:
            return
        if (first.kind, first.description) != (self.kind, self.description):
            raise ValueError(f"metric family {self.name!r} already exists with a different "
                             "kind or description")
        self._series, self._lock = first._series, first._lock

    @property
    def metrics(self) -> list[Metric]:
        with self._lock:
            return list(self._series.values())

    def Metric(
        self, labels: dict[str, str] | None = None, buckets: list[float] | None = None
    ) -> Metric:
        if self.kind is MetricKind.HISTOGRAM and buckets is None:
            raise ValueError("a histogram metric needs buckets")
        if self.kind is not MetricKind.HISTOGRAM and buckets is not None:
            raise ValueError("buckets are only for histogram metrics")
        labels = _check_labels(labels or {}, self.kind)
        key = tuple(sorted(labels.items()))
        with self._lock:
            metric = self._series.get(key)
            if metric is None:
                metric = self._series[key] = Metric(self.kind, labels, buckets)
        if buckets is not None and _bucket_bounds(buckets) != metric._bounds:
            raise ValueError(f"metric {self.name}{labels} already exists with other buckets")
        return metric

    def snapshot(self) -> FamilySnapshot:
        series = tuple(metric.snapshot() for metric in self.metrics)
        return FamilySnapshot(self.name, self.description, self.kind.type_name, series)

    @classmethod
    def families(cls) -> list[MetricFamily]:
        with cls._registry_lock:
            return list(cls._registry.values())

    @classmethod
    def snapshots(cls) -> list[FamilySnapshot]:
        """Every registered family, as exporters read them."""
        return [family.snapshot() for family in cls.families()]
