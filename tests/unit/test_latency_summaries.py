"""The summaries' quantile window: exact while few values, within the relative error asked
for beyond; prometheus-cpp's sliding minute; how a model's statistics feed it; and the
first response histogram's buckets."""

from __future__ import annotations

import math
import random

import pytest
from google.protobuf import text_format

from tests.unit.clock import FakeClock
from tritium.core.config_pb import model_config_pb2
from tritium.core.first_response import (
    DEFAULT_BUCKETS_MS,
    FirstResponseHistogram,
    configured_buckets,
)
from tritium.core.statistics import ModelStatistics
from tritium.core.summaries import (
    EXACT_LIMIT,
    ObservedDuration,
    QuantileWindow,
    arm,
    window_of,
)


def nearest_rank(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(max(math.ceil(q * len(ordered)), 1), len(ordered)) - 1]


def test_an_empty_window_has_no_quantiles() -> None:
    assert all(math.isnan(v) for v in QuantileWindow(0.01).quantiles([0.5, 0.99]))


def test_few_values_give_exact_quantiles() -> None:
    window = QuantileWindow(0.05)
    values = list(range(1, 101))
    random.Random(1).shuffle(values)
    for value in values:
        window.observe(value)
    assert window.quantiles([0.0, 0.5, 0.9, 0.99, 0.999, 1.0]) == [1, 50, 90, 99, 100, 100]


@pytest.mark.parametrize("error", [0.05, 0.01, 0.001])
def test_many_values_stay_within_the_relative_error(error: float) -> None:
    rng = random.Random(7)
    values = [int(rng.lognormvariate(8, 1.5)) for _ in range(20 * EXACT_LIMIT)]
    window = QuantileWindow(error)
    for value in values:
        window.observe(value)
    wanted = [0.5, 0.9, 0.95, 0.99, 0.999]
    for q, estimate in zip(wanted, window.quantiles(wanted), strict=True):
        exact = nearest_rank(values, q)
        assert abs(estimate - exact) <= error * exact + 1e-9, (q, estimate, exact)


def test_zero_values_are_counted_as_zero() -> None:
    window = QuantileWindow(0.01)
    for value in [0] * 3000 + [100] * 1000:
        window.observe(value)
    assert window.quantiles([0.5, 0.75, 0.76]) == [0.0, 0.0, pytest.approx(100, rel=0.01)]


def test_the_window_holds_the_last_minute_in_five_steps() -> None:
    clock = FakeClock(1000.0)
    window = QuantileWindow(0.01, clock=clock)
    window.observe(10)  # the first 12 s turn
    clock.now += 30
    window.observe(20)  # the third turn
    clock.now += 29.9  # 59.9 s after the first value
    assert window.quantiles([0.0, 1.0]) == [10, 20]
    clock.now += 0.1  # its age bucket is forgotten as a whole
    assert window.quantiles([0.0, 1.0]) == [20, 20]
    clock.now += 3600  # an idle hour forgets everything, however many turns passed
    assert math.isnan(window.quantiles([0.5])[0])
    window.observe(30)
    assert window.quantiles([0.5]) == [30]


def test_a_window_keeps_bounded_memory() -> None:
    window = QuantileWindow(0.01)
    for value in range(1, 200_000):
        window.observe(value)
    buckets = window._buckets
    assert all(len(b.values) <= EXACT_LIMIT for b in buckets)
    # Values up to 2e5 at 1% need about ln(2e5) / 0.02 buckets, not one per value.
    assert sum(len(b.counts) for b in buckets) < 700


def test_observed_duration_reports_each_addition_in_microseconds() -> None:
    window = QuantileWindow(0.01)
    duration = ObservedDuration(window, count=2, ns=10_000)
    duration.count += 1
    duration.ns += 4_999_999  # the scheduler's written-out Duration.add
    duration.add(2_000)
    assert (duration.count, duration.ns) == (4, 10_000 + 4_999_999 + 2_000)
    assert window.quantiles([0.0, 1.0]) == [2, 4999]


def test_arm_observes_what_the_counters_count() -> None:
    stats = ModelStatistics()
    stats.success.add(1_000_000)  # before arming: kept in the totals, not in the window
    stats.record_execution(1, 1, 3_000)
    arm(stats, [(0.5, 0.05), (0.99, 0.001)], cached=False)
    stats.success.add(2_000_000)
    stats.queue.add(5_000)
    stats.record_execution(1, 1, 7_000)  # a batch size seen before
    stats.record_execution(4, 1, 9_000)  # a new one
    assert (stats.success.count, stats.success.ns) == (2, 3_000_000)
    assert stats.compute_infer.count == 3
    success, compute = window_of(stats, "success"), window_of(stats, "compute_infer")
    assert success is not None and compute is not None
    assert success.quantiles([0.5]) == [2000]
    assert compute.quantiles([0.0, 1.0]) == [7, 9]
    assert window_of(stats, "cache_hit") is None


def test_a_cached_model_keeps_cache_summaries_instead_of_the_request_one() -> None:
    stats = ModelStatistics()
    arm(stats, [(0.5, 0.05)], cached=True)
    assert window_of(stats, "success") is None
    for stage in ("queue", "compute_infer", "cache_hit", "cache_miss"):
        assert window_of(stats, stage) is not None, stage


def test_unarmed_statistics_have_no_windows() -> None:
    stats = ModelStatistics()
    stats.record_execution(1, 1, 5)
    assert all(window_of(stats, stage) is None
               for stage in ("success", "queue", "compute_infer", "cache_hit"))
    assert type(stats.batches[1]) is not ObservedDuration


def test_first_response_histogram_buckets_are_cumulative() -> None:
    histogram = FirstResponseHistogram((500, 100))
    for ms in (0, 100, 101, 499, 7000):
        histogram.observe(ms)
    cumulative, total = histogram.snapshot()
    assert histogram.bounds == (100, 500)
    assert cumulative == [2, 4, 5]  # <= 100, <= 500, +Inf (the count)
    assert total == 0 + 100 + 101 + 499 + 7000


def test_a_model_config_chooses_the_histogram_buckets(caplog: pytest.LogCaptureFixture) -> None:
    config = model_config_pb2.ModelConfig()
    assert configured_buckets(config, "m") == DEFAULT_BUCKETS_MS == (100, 500, 2000, 5000)
    text_format.Parse(
        'model_metrics { metric_control [ { metric_identifier { family: "nv_unknown" } '
        'histogram_options { buckets: [ 3 ] } }, { metric_identifier { family: '
        '"nv_inference_first_response_histogram_ms" } histogram_options { buckets: [ 1, 2.5 ] '
        '} } ] }', config)
    assert configured_buckets(config, "m") == (1, 2.5)
    assert "Metric family 'nv_unknown' in 'metric_identifier' is not a customizable metric" \
        in caplog.text
