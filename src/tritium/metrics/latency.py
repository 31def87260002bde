"""The latency summaries (``--metrics-config summary_latencies=true``): quantiles over the
last minute from each model's windows, with the sum and count of every observation as
the duration counters have them."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client.core import HistogramMetricFamily, Metric

from tritium.core.first_response import FAMILY as FIRST_RESPONSE
from tritium.core.statistics import Duration, ModelStatistics
from tritium.core.summaries import window_of
from tritium.metrics.labels import format_value, label_names, label_values

# (name, help, the statistics' stage its quantiles come from, how to read its totals).
# Input and output handling run inside execute() and count as 0 us per execution, so
# their quantiles are 0 whenever compute_infer's window holds an execution.
SUMMARIES: tuple[tuple[str, str, str, Callable[[ModelStatistics], Duration]], ...] = (
    ("nv_inference_request_summary_us",
     "Summary of inference request duration in microseconds (includes cached requests)",
     "success", lambda s: s.success),
    ("nv_inference_queue_summary_us",
     "Summary of inference queuing duration in microseconds (includes cached requests)",
     "queue", lambda s: s.queue),
    ("nv_inference_compute_input_summary_us",
     "Summary of compute input duration in microseconds (does not include cached requests)",
     "compute_infer", lambda s: s.compute_input),
    ("nv_inference_compute_infer_summary_us",
     "Summary of compute inference duration in microseconds (does not include cached "
     "requests)",
     "compute_infer", lambda s: s.compute_infer),
    ("nv_inference_compute_output_summary_us",
     "Summary of compute output duration in microseconds (does not include cached "
     "requests)",
     "compute_infer", lambda s: s.compute_output),
    ("nv_cache_hit_summary_per_model",
     "Summary of cache hit counts/durations per model, in microseconds",
     "cache_hit", lambda s: s.cache_hit),
    ("nv_cache_miss_summary_per_model",
     "Summary of cache miss counts/durations per model, in microseconds",
     "cache_miss", lambda s: s.cache_miss),
)
_ZERO_STAGES = ("nv_inference_compute_input_summary_us",
                "nv_inference_compute_output_summary_us")
NAMES = (*(name for name, _, _, _ in SUMMARIES), FIRST_RESPONSE)


def summary_families(models: Sequence[tuple[Any, ModelStatistics, dict[str, str]]],
                     quantiles: Sequence[float]) -> Iterator[Metric]:
    """One family per summary that some model keeps; a model's series in it where its
    statistics observe that stage."""
    names = [format_value(q) for q in quantiles]
    for name, text, stage, read in SUMMARIES:
        family = Metric(name, text, "summary")
        for _, stats, labels in models:
            window = window_of(stats, stage)
            if window is None:
                continue
            values = window.quantiles(quantiles)
            if name in _ZERO_STAGES:
                values = [v if math.isnan(v) else 0.0 for v in values]
            totals = read(stats)
            # prometheus-cpp's order: count, sum, then each quantile.
            family.add_sample(f"{name}_count", labels, totals.count)
            family.add_sample(f"{name}_sum", labels, totals.ns // 1000)
            for quantile, value in zip(names, values, strict=True):
                family.add_sample(name, {**labels, "quantile": quantile}, value)
        if family.samples:
            yield family


def first_response_family(models: Sequence[tuple[Any, ModelStatistics, dict[str, str]]]
                          ) -> Iterator[Metric]:
    """``nv_inference_first_response_histogram_ms``, for the versions that keep it (each
    with its own buckets)."""
    kept = [(model.first_response, labels) for model, _, labels in models
            if getattr(model, "first_response", None) is not None]
    family = HistogramMetricFamily(
        FIRST_RESPONSE, "Duration from request to first response in milliseconds",
        labels=(names := label_names(models)))
    for histogram, labels in kept:
        cumulative, total = histogram.snapshot()
        bounds = [format_value(bound) for bound in histogram.bounds] + ["+Inf"]
        family.add_metric(label_values(labels, names), list(zip(bounds, cumulative,
                                                                strict=True)), total)
    if kept:
        yield family
