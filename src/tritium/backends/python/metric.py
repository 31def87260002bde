"""pb_utils.MetricFamily and Metric: custom model metrics, read by the metrics endpoint.

Families live in one process-wide registry keyed by name, as in Triton's Prometheus
registry: a second family with the same name and kind shares the first one's series (and
keeps the first description), one of another kind is refused. Each ``Metric()`` call returns
a new handle on the series its labels name; when the MetricFamily object a handle came from
is deleted, the handle stops working, as Triton's stub clears a family's metrics with it.
Models update metrics from their instance threads and the endpoint reads them from its own,
so every read and write holds the series' lock; exporters read ``snapshot()``s.
Every refusal Triton reports as an error is a TritonModelException with Triton's text; a
wrong argument type is a TypeError, as pybind11 raises it.
"""

from __future__ import annotations

import bisect
import enum
import itertools
import math
import re
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from tritium.backends.python import scope
from tritium.backends.python.errors import TritonModelException
from tritium.backends.python.text import as_text
from tritium.core import messages

# Prometheus's (pre-UTF-8) naming rules, as prometheus-cpp enforces them.
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
class Bucket:
    """A histogram bucket: how many observations were at most ``bound`` (cumulative)."""

    bound: float
    count: int


@dataclass(frozen=True, slots=True)
class SeriesSnapshot:
    """One series at one moment. Histograms: ``value`` is the sum of observations and
    ``buckets`` the cumulative counts, ending with +Inf."""

    labels: dict[str, str]
    value: float
    count: int = 0
    buckets: tuple[Bucket, ...] = ()


@dataclass(frozen=True, slots=True)
class FamilySnapshot:
    name: str
    description: str
    kind: str
    series: tuple[SeriesSnapshot, ...]


def _refused(template: str, reason: str) -> TritonModelException:
    return TritonModelException(template.format(reason=reason))


def _unsupported(template: str, kind: MetricKind, operation: str) -> TritonModelException:
    return _refused(template, messages.METRIC_UNSUPPORTED.format(kind=kind.name,
                                                                 operation=operation))


def _as_double(value: object) -> float:
    """A number as pybind11 converts it to a C++ double; anything else is a TypeError."""
    if isinstance(value, str | bytes | bytearray):
        raise TypeError(f"incompatible function arguments: expected a float, got {value!r}")
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TypeError(f"incompatible function arguments: expected a float, "
                        f"got {value!r}") from None


def _check_labels(labels: object, kind: MetricKind) -> dict[str, str]:
    if labels is None:
        return {}
    if not isinstance(labels, dict):
        raise TritonModelException(messages.METRIC_LABELS_NOT_DICT)
    for key, value in labels.items():
        if not isinstance(key, str) or not _LABEL_NAME.fullmatch(key) or key.startswith("__") \
                or (kind is MetricKind.HISTOGRAM and key == _HISTOGRAM_LABEL):
            raise _refused(messages.METRIC_CREATE, messages.METRIC_INVALID_LABEL)
        if not isinstance(value, str):
            raise _refused(messages.METRIC_CREATE,
                           messages.METRIC_LABEL_VALUE.format(name=key))
    return dict(labels)


def _check_buckets(buckets: object, kind: MetricKind) -> tuple[float, ...]:
    """Finite upper bounds, strictly increasing; +Inf is always the implicit last bucket."""
    if buckets is None:
        if kind is MetricKind.HISTOGRAM:
            raise TritonModelException(messages.METRIC_MISSING_BUCKETS)
        return ()
    if not isinstance(buckets, list):
        raise TritonModelException(messages.METRIC_BUCKETS_NOT_LIST)
    if kind is not MetricKind.HISTOGRAM:
        raise TritonModelException(messages.METRIC_UNEXPECTED_BUCKETS)
    bounds = [_as_double(b) for b in buckets]
    if bounds and bounds[-1] == math.inf:
        bounds.pop()
    if any(math.isnan(b) or math.isinf(b) for b in bounds) \
            or any(a >= b for a, b in itertools.pairwise(bounds)):
        raise _refused(messages.METRIC_CREATE, messages.METRIC_UNSORTED_BUCKETS)
    return tuple(bounds)


class _Series:
    """The values of one labelled series, shared by every handle on it."""

    def __init__(self, kind: MetricKind, labels: dict[str, str], bounds: tuple[float, ...]):
        self.kind = kind
        self.labels = labels
        self.bounds = bounds
        self.lock = threading.Lock()
        self.value = 0.0  # the counter or gauge value; a histogram's sum
        self.count = 0
        # Per bucket, not cumulative; the last one is +Inf.
        self.bucket_counts = [0] * (len(bounds) + 1)

    def add(self, value: float) -> None:
        with self.lock:
            self.value += value

    def set(self, value: float) -> None:
        with self.lock:
            self.value = value

    def get(self) -> float:
        with self.lock:
            return self.value

    def observe(self, value: float) -> None:
        # "le" buckets: a value equal to a bound belongs to that bound's bucket.
        index = len(self.bounds) if math.isnan(value) else bisect.bisect_left(self.bounds, value)
        with self.lock:
            self.bucket_counts[index] += 1
            self.value += value
            self.count += 1

    def snapshot(self) -> SeriesSnapshot:
        with self.lock:
            value, count, counts = self.value, self.count, list(self.bucket_counts)
        if self.kind is not MetricKind.HISTOGRAM:
            return SeriesSnapshot(dict(self.labels), value)
        cumulative, total = [], 0
        for bound, n in zip((*self.bounds, math.inf), counts, strict=True):
            total += n
            cumulative.append(Bucket(bound, total))
        return SeriesSnapshot(dict(self.labels), value, count, tuple(cumulative))


class Series(Protocol):
    """The values behind Metric handles: here, or in the server (an instance process)."""

    kind: MetricKind
    labels: dict[str, str]

    def add(self, value: float) -> None: ...

    def set(self, value: float) -> None: ...

    def get(self) -> float: ...

    def observe(self, value: float) -> None: ...

    def snapshot(self) -> SeriesSnapshot: ...


class Family(Protocol):
    """What every MetricFamily object of one name shares."""

    name: str
    description: str
    kind: MetricKind

    def get_series(self, labels: dict[str, str], bounds: tuple[float, ...]) -> Series: ...

    def snapshot(self) -> FamilySnapshot: ...


class Metric:
    """A handle on one labelled series of a family."""

    __slots__ = ("__weakref__", "_cleared", "_series", "buckets", "kind", "labels")

    def __init__(self, series: Series, buckets: list[float] | None):
        self._series = series
        self._cleared = False
        self.kind = series.kind
        self.labels = dict(series.labels)
        self.buckets = buckets

    def _check(self, template: str, operation: str, allowed: Callable[[MetricKind], bool],
               ) -> None:
        if self._cleared:
            raise _refused(template, messages.METRIC_FAMILY_DELETED)
        if not allowed(self.kind):
            raise _unsupported(template, self.kind, operation)

    def increment(self, value: float) -> None:
        value = _as_double(value)
        self._check(messages.METRIC_INCREMENT, "Increment",
                    lambda kind: kind is not MetricKind.HISTOGRAM)
        if self.kind is MetricKind.COUNTER and value < 0:
            raise _refused(messages.METRIC_INCREMENT, messages.METRIC_NEGATIVE_INCREMENT)
        self._series.add(value)

    def set(self, value: float) -> None:
        value = _as_double(value)
        self._check(messages.METRIC_SET, "Set", lambda kind: kind is MetricKind.GAUGE)
        self._series.set(value)

    def observe(self, value: float) -> None:
        value = _as_double(value)
        self._check(messages.METRIC_OBSERVE, "Observe",
                    lambda kind: kind is MetricKind.HISTOGRAM)
        self._series.observe(value)

    def value(self) -> float:
        self._check(messages.METRIC_VALUE, "Value",
                    lambda kind: kind is not MetricKind.HISTOGRAM)
        return self._series.get()

    def snapshot(self) -> SeriesSnapshot:
        return self._series.snapshot()

    def _clear(self) -> None:
        self._cleared = True


@dataclass(eq=False)
class RegisteredFamily:
    """A name in the registry: what every MetricFamily object of that name shares."""

    name: str
    description: str
    kind: MetricKind
    series: dict[tuple[tuple[str, str], ...], _Series] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def get_series(self, labels: dict[str, str], bounds: tuple[float, ...]) -> _Series:
        # Labels already in use name the series they have; its buckets stay as first given.
        key = tuple(sorted(labels.items()))
        with self.lock:
            series = self.series.get(key)
            if series is None:
                series = self.series[key] = _Series(self.kind, labels, bounds)
            return series

    def snapshot(self) -> FamilySnapshot:
        with self.lock:
            series = list(self.series.values())
        return FamilySnapshot(self.name, self.description, self.kind.type_name,
                              tuple(s.snapshot() for s in series))


def _kind(kind: object) -> MetricKind:
    # Triton's kind is a pybind11 enum: anything but one of its members is a TypeError.
    if isinstance(kind, bool) or not isinstance(kind, int) or kind not in set(MetricKind):
        raise TypeError(f"invalid metric family kind {kind!r}: use MetricFamily.COUNTER, "
                        "GAUGE or HISTOGRAM")
    return MetricKind(kind)


class MetricFamily:
    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    _registry: ClassVar[dict[str, RegisteredFamily]] = {}
    _registry_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, name: str | bytes, description: str | bytes, kind: int) -> None:
        self._handles: weakref.WeakSet[Metric] = weakref.WeakSet()
        name, description = as_text(name), as_text(description)  # std::string in Triton
        if not isinstance(name, str) or not isinstance(description, str):
            raise TypeError("MetricFamily name and description must be str, got "
                            f"{name!r}, {description!r}")
        kind = _kind(kind)
        if not _METRIC_NAME.fullmatch(name):
            raise _refused(messages.METRIC_CREATE_FAMILY, messages.METRIC_INVALID_NAME)
        family = self.register(name, description, kind)
        if family.kind is not kind:
            raise _refused(messages.METRIC_CREATE_FAMILY, messages.METRIC_OTHER_KIND)
        self._family: Family = family
        self.name, self.description, self.kind = name, family.description, kind

    @classmethod
    def register(cls, name: str, description: str, kind: MetricKind) -> Family:
        """The family registered under ``name``, registered now if it is new."""
        link = scope.current_link()
        if link is None:
            return cls.register_here(name, description, kind)
        return link.metric_family(name, description, kind)

    @classmethod
    def register_here(cls, name: str, description: str, kind: MetricKind) -> RegisteredFamily:
        """``register`` in this process's registry, the one the metrics endpoint reads."""
        with cls._registry_lock:
            return cls._registry.setdefault(name, RegisteredFamily(name, description, kind))

    def __del__(self) -> None:
        # Triton's stub clears the metrics a family created when the family goes away.
        for metric in list(getattr(self, "_handles", ())):
            metric._clear()

    @property
    def metrics(self) -> list[Metric]:
        return list(self._handles)

    def Metric(self, labels: dict[str, str] | None = None,
               buckets: list[float] | None = None) -> Metric:
        # Checked in Triton's order: the stub's argument checks, then the server's.
        if labels is not None and not isinstance(labels, dict):
            raise TritonModelException(messages.METRIC_LABELS_NOT_DICT)
        bounds = _check_buckets(buckets, self.kind)
        labels = _check_labels(labels, self.kind)
        metric = Metric(self._family.get_series(labels, bounds), buckets)
        self._handles.add(metric)
        return metric

    def snapshot(self) -> FamilySnapshot:
        return self._family.snapshot()

    @classmethod
    def families(cls) -> list[RegisteredFamily]:
        with cls._registry_lock:
            return list(cls._registry.values())

    @classmethod
    def snapshots(cls) -> list[FamilySnapshot]:
        """Every registered family, as exporters read them."""
        return [family.snapshot() for family in cls.families()]
