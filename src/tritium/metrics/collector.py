"""Prometheus families with Triton's names, read from each model's statistics."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from prometheus_client.core import (
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from tritium.core.statistics import STOP_BUCKETS_MS, ModelStatistics

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


def _counter(name: str, text: str) -> Metric:
    # Triton's counters have no "_total" suffix, which prometheus-client's
    # CounterMetricFamily would add to every sample; samples are named by hand instead.
    return Metric(name, text, "counter")


def _sorted(labels: dict[str, str]) -> dict[str, str]:
    # Exposition keeps insertion order; Triton prints labels sorted by name.
    return dict(sorted(labels.items()))


class ModelView(Protocol):
    """What the collector needs to know about one loaded model version."""

    name: str
    version: int
    load_seconds: float

    def statistics(self) -> ModelStatistics: ...


class TritonCollector(Collector):
    def __init__(self, models: Callable[[], Iterable[ModelView]]):
        self._models = models

    def collect(self) -> Iterator[Metric]:
        models = [(m, m.statistics(), {"model": m.name, "version": str(m.version)})
                  for m in self._models()]
        for name, text, read in COUNTERS:
            family = _counter(name, text)
            for _, stats, labels in models:
                family.add_sample(name, labels, read(stats))
            yield family
        yield self._failures(models)
        yield self._pending(models)
        yield self._load_time(models)
        yield self._cancellations(models)
        yield from self._stop_delay(models)

    def _failures(self, models: list[Any]) -> Metric:
        name = "nv_inference_request_failure"
        family = _counter(name, "Number of failed inference requests, all batch sizes")
        for _, stats, labels in models:
            failures = dict(stats.failures)
            for reason in FAILURE_REASONS:
                family.add_sample(name, _sorted({**labels, "reason": reason}),
                                  failures.get(reason, 0))
        return family

    def _pending(self, models: list[Any]) -> Metric:
        family = GaugeMetricFamily("nv_inference_pending_request_count",
                                   "Instantaneous number of pending requests awaiting execution "
                                   "per-model.", labels=("model", "version"))
        for _, stats, labels in models:
            family.add_metric((labels["model"], labels["version"]), max(stats.pending, 0))
        return family

    def _load_time(self, models: list[Any]) -> Metric:
        family = GaugeMetricFamily("nv_model_load_duration_secs",
                                   "Model load time in seconds", labels=("model", "version"))
        for model, _, labels in models:
            family.add_metric((labels["model"], labels["version"]), model.load_seconds)
        return family

    def _cancellations(self, models: list[Any]) -> Metric:
        name = "tritium_inference_cancellation"
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

    def _stop_delay(self, models: list[Any]) -> Iterator[Metric]:
        family = HistogramMetricFamily(
            "tritium_cancellation_stop_delay_ms",
            "Delay from a cancellation to the model's work stopping (execute() returned, or "
            "FINAL sent by a decoupled model), in milliseconds",
            labels=("model", "version"),
        )
        for _, stats, labels in models:
            buckets = [(str(bound), count) for bound, count in
                       zip(STOP_BUCKETS_MS, stats.cancel_stop_buckets, strict=True)]
            buckets.append(("+Inf", stats.cancel_stop.count))
            family.add_metric((labels["model"], labels["version"]), buckets,
                              stats.cancel_stop.ns / 1e6)
        yield family
