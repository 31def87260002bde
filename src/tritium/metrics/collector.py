"""Prometheus families with Triton's names, read from each model's statistics, and the
families models register themselves (pb_utils.MetricFamily), written from their snapshots."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from prometheus_client.core import (
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from tritium.core.statistics import STOP_BUCKETS_MS, ModelStatistics
from tritium.feature_config import LatencyMetrics
from tritium.metrics import generation, latency
from tritium.metrics.labels import format_value, label_names, label_values, model_labels

log = logging.getLogger("tritium.metrics")

FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
STAGES = ("queued", "executing")
CANCEL_REASONS = ("CLIENT_DISCONNECTED", "CLIENT_CANCELLED", "DEADLINE", "SHUTDOWN", "UNLOADED",
                  "PARENT_CANCELLED")

# (name, help, how to read it from the statistics); all counters, in microseconds where timed.
COUNTERS: tuple[tuple[str, str, Callable[[ModelStatistics], float]], ...] = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes",
     lambda s: s.success.count),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)",
     lambda s: s.inference_count),
    ("nv_inference_exec_count",
     "Number of model executions performed (does not include cached requests)",
     lambda s: s.execution_count),
    ("nv_inference_request_duration_us",
     "Cumulative inference request duration in microseconds (includes cached requests)",
     lambda s: s.success.ns // 1000),
    ("nv_inference_queue_duration_us",
     "Cumulative inference queuing duration in microseconds (includes cached requests)",
     lambda s: s.queue.ns // 1000),
    ("nv_inference_compute_input_duration_us",
     "Cumulative compute input duration in microseconds (does not include cached requests)",
     lambda s: s.compute_input.ns // 1000),
    ("nv_inference_compute_infer_duration_us",
     "Cumulative compute inference duration in microseconds (does not include cached requests)",
     lambda s: s.compute_infer.ns // 1000),
    ("nv_inference_compute_output_duration_us",
     "Cumulative inference compute output duration in microseconds (does not include cached "
     "requests)",
     lambda s: s.compute_output.ns // 1000),
)

# Per-model response cache families: only for versions whose cache is enabled.
CACHE_COUNTERS: tuple[tuple[str, str, Callable[[ModelStatistics], float]], ...] = (
    ("nv_cache_num_hits_per_model", "Number of cache hits per model",
     lambda s: s.cache_hit.count),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model",
     lambda s: s.cache_miss.count),
    ("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds",
     lambda s: s.cache_hit.ns // 1000),
    ("nv_cache_miss_duration_per_model",
     "Total cache miss (insert+lookup) duration per model, in microseconds",
     lambda s: s.cache_miss.ns // 1000),
)

FAILURES = "nv_inference_request_failure"
PENDING = "nv_inference_pending_request_count"
LOAD_TIME = "nv_model_load_duration_secs"
CANCELLATIONS = "tritium_inference_cancellation"
STOP_DELAY = "tritium_cancellation_stop_delay_ms"
# Triton has no such family (its stubs are not restarted); tritium's own, in its style.
RESTARTS = "tritium_model_instance_restarts"
BUILTIN_NAMES = frozenset(
    [name for name, _, _ in COUNTERS + CACHE_COUNTERS]
    + [FAILURES, PENDING, LOAD_TIME, CANCELLATIONS, STOP_DELAY, RESTARTS]
    + list(generation.NAMES) + list(latency.NAMES)
)
# Left out with counter_latencies=false, as Triton leaves them out (the cache's counts too).
LATENCY_COUNTERS = frozenset(name for name, _, _ in COUNTERS if name.endswith("_duration_us"))


def _counter(name: str, text: str) -> Metric:
    # Triton's counters have no "_total" suffix, which prometheus-client's
    # CounterMetricFamily would add to every sample; samples are named by hand instead.
    return Metric(name, text, "counter")


def _sorted(labels: dict[str, str]) -> dict[str, str]:
    # Triton prints labels sorted by name; sorted here so the order does not depend on
    # the prometheus-client version (older ones print them in insertion order).
    return dict(sorted(labels.items()))


class ModelView(Protocol):
    """What the collector needs to know about one loaded model version."""

    name: str
    version: int
    load_seconds: float

    def statistics(self) -> ModelStatistics: ...


class BucketView(Protocol):
    """A histogram bucket: how many observations were at most ``bound`` (cumulative)."""

    @property
    def bound(self) -> float: ...
    @property
    def count(self) -> int: ...


class SeriesView(Protocol):
    """One series of a model's own family. Histograms: ``value`` is the sum of
    observations, ``buckets`` the cumulative counts ending with +Inf."""

    @property
    def labels(self) -> Mapping[str, str]: ...
    @property
    def value(self) -> float: ...
    @property
    def count(self) -> int: ...
    @property
    def buckets(self) -> Sequence[BucketView]: ...


class FamilyView(Protocol):
    """A family a model registered; ``kind`` is "counter", "gauge" or "histogram"."""

    @property
    def name(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def series(self) -> Sequence[SeriesView]: ...


class CustomCollector:
    """Models' own families, in the text prometheus-cpp writes for Triton: labels sorted by
    name with a histogram's "le" last, counts as integers, values as C++ streams print a
    double at 16 significant digits ("1", "0.1", "7.55"), and count, sum, then buckets."""

    def __init__(self, families: Callable[[], Iterable[FamilyView]]):
        self._families = families
        self._warned: set[str] = set()

    def render(self) -> str:
        lines: list[str] = []
        for family in self._families():
            if family.name in BUILTIN_NAMES:
                # Two families of one name would make the whole scrape invalid.
                self._warn_once(family.name)
                continue
            lines.extend(_family_lines(family))
        return "".join(f"{line}\n" for line in lines)

    def _warn_once(self, name: str) -> None:
        if name not in self._warned:
            self._warned.add(name)
            log.warning("metric family %r of a model is not exposed: the server uses that name",
                        name)


def _escape(text: str, quote: bool) -> str:
    text = text.replace("\\", "\\\\").replace("\n", "\\n")
    return text.replace('"', '\\"') if quote else text


def _sample(name: str, labels: Mapping[str, str], value: str, le: str | None = None) -> str:
    pairs = [f'{key}="{_escape(text, True)}"' for key, text in sorted(labels.items())]
    if le is not None:
        pairs.append(f'le="{le}"')
    return f"{name}{{{','.join(pairs)}}} {value}" if pairs else f"{name} {value}"


def _family_lines(family: FamilyView) -> Iterator[str]:
    name = family.name
    if family.description:
        yield f"# HELP {name} {_escape(family.description, False)}"
    yield f"# TYPE {name} {family.kind}"
    for series in family.series:
        labels = series.labels
        if family.kind != "histogram":
            yield _sample(name, labels, format_value(series.value))
            continue
        yield _sample(f"{name}_count", labels, str(series.count))
        yield _sample(f"{name}_sum", labels, format_value(series.value))
        for bucket in series.buckets:
            yield _sample(f"{name}_bucket", labels, str(bucket.count),
                          le=format_value(bucket.bound))


class TritonCollector(Collector):
    """Triton's families for every loaded model version; ``latency`` says which of its
    latency families (--metrics-config)."""

    def __init__(self, models: Callable[[], Iterable[ModelView]],
                 latency: LatencyMetrics | None = None):
        self._models = models
        self._latency = latency or LatencyMetrics()

    def collect(self) -> Iterator[Metric]:
        models = [(m, m.statistics(), model_labels(m)) for m in self._models()]
        counters = self._latency.counters
        for name, text, read in COUNTERS:
            if not counters and name in LATENCY_COUNTERS:
                continue
            family = _counter(name, text)
            for _, stats, labels in models:
                family.add_sample(name, labels, read(stats))
            yield family
        if counters:
            yield from self._cache(models)
        if self._latency.summaries:
            quantiles = [q for q, _ in self._latency.quantiles]
            yield from latency.summary_families(models, quantiles)
        if self._latency.histograms:
            yield from latency.first_response_family(models)
        yield self._failures(models)
        yield self._pending(models)
        yield self._load_time(models)
        yield self._cancellations(models)
        yield from self._stop_delay(models)
        yield self._restarts(models)
        yield from generation.generation_families(models)

    def _cache(self, models: list[Any]) -> Iterator[Metric]:
        cached = [(stats, labels) for model, stats, labels in models
                  if getattr(model, "cache", None) is not None]
        if not cached:
            return
        for name, text, read in CACHE_COUNTERS:
            family = _counter(name, text)
            for stats, labels in cached:
                family.add_sample(name, labels, read(stats))
            yield family

    def _failures(self, models: list[Any]) -> Metric:
        name = FAILURES
        family = _counter(name, "Number of failed inference requests, all batch sizes")
        for _, stats, labels in models:
            failures = dict(stats.failures)
            for reason in FAILURE_REASONS:
                family.add_sample(name, _sorted({**labels, "reason": reason}),
                                  failures.get(reason, 0))
        return family

    def _pending(self, models: list[Any]) -> Metric:
        family = GaugeMetricFamily(PENDING,
                                   "Instantaneous number of pending requests awaiting execution "
                                   "per-model.", labels=(names := label_names(models)))
        for _, stats, labels in models:
            family.add_metric(label_values(labels, names), max(stats.pending, 0))
        return family

    def _load_time(self, models: list[Any]) -> Metric:
        family = GaugeMetricFamily(LOAD_TIME,
                                   "Model load time in seconds",
                                   labels=(names := label_names(models)))
        for model, _, labels in models:
            family.add_metric(label_values(labels, names), model.load_seconds)
        return family

    def _cancellations(self, models: list[Any]) -> Metric:
        name = CANCELLATIONS
        family = _counter(
            name, "Requests cancelled, by reason and by where the request was (queued or executing)"
        )
        for _, stats, labels in models:
            counts = dict(stats.cancellations)
            for reason in CANCEL_REASONS:
                for stage in STAGES:
                    family.add_sample(name, _sorted({**labels, "reason": reason, "stage": stage}),
                                      counts.get((reason, stage), 0))
        return family

    def _restarts(self, models: list[Any]) -> Metric:
        """Process-kind instances only: a thread instance is never restarted."""
        family = _counter(RESTARTS, "Times an instance process was restarted after it died, "
                                    "per model instance")
        for model, _, labels in models:
            restarts = getattr(model, "instance_restarts", None)
            for instance, count in sorted((restarts() if restarts else {}).items()):
                family.add_sample(RESTARTS, _sorted({**labels, "instance": instance}), count)
        return family

    def _stop_delay(self, models: list[Any]) -> Iterator[Metric]:
        family = HistogramMetricFamily(
            STOP_DELAY,
            "Delay from a cancellation to the model's work stopping (execute() returned, or "
            "FINAL sent by a decoupled model), in milliseconds",
            labels=(names := label_names(models)),
        )
        for _, stats, labels in models:
            buckets = [(str(bound), count) for bound, count in
                       zip(STOP_BUCKETS_MS, stats.cancel_stop_buckets, strict=True)]
            buckets.append(("+Inf", stats.cancel_stop.count))
            family.add_metric(label_values(labels, names), buckets,
                              stats.cancel_stop.ns / 1e6)
        yield family
