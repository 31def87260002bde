"""pb_utils.MetricFamily kinds and histograms, and how the collector prints them."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterable

import pytest
from prometheus_client import CollectorRegistry

from tritium.backends.python.metric import FamilySnapshot, MetricFamily, SeriesSnapshot
from tritium.metrics.collector import CustomCollector, FamilyView, TritonCollector
from tritium.metrics.server import render


def unique(prefix: str) -> str:
    # The registry is process-wide: each test uses names no other test has used.
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def rendered(families: Iterable[FamilyView]) -> list[str]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TritonCollector(lambda: (), custom=lambda: families))
    return [line for line in render(registry).decode().splitlines()
            if not line.startswith(("nv_", "tritium_", "# HELP nv_", "# TYPE nv_",
                                    "# HELP tritium_", "# TYPE tritium_"))]


# -- kinds -----------------------------------------------------------------------


def test_counter_only_increments_upward() -> None:
    metric = MetricFamily(unique("c"), "", MetricFamily.COUNTER).Metric()
    metric.increment(2)
    metric.increment(0.5)
    assert metric.value() == 2.5
    with pytest.raises(ValueError, match="negative"):
        metric.increment(-1)
    with pytest.raises(ValueError):
        metric.set(1)
    with pytest.raises(ValueError):
        metric.observe(1)


def test_gauge_sets_and_increments_both_ways() -> None:
    metric = MetricFamily(unique("g"), "", MetricFamily.GAUGE).Metric(labels={"a": "1"})
    metric.set(5)
    metric.increment(-2)
    assert metric.value() == 3
    with pytest.raises(ValueError):
        metric.observe(1)


def test_histogram_needs_buckets_and_only_observes() -> None:
    family = MetricFamily(unique("h"), "", MetricFamily.HISTOGRAM)
    with pytest.raises(ValueError, match="needs buckets"):
        family.Metric()
    metric = family.Metric(buckets=[1.0])
    for call in (metric.value, lambda: metric.increment(1), lambda: metric.set(1)):
        with pytest.raises(ValueError):
            call()


def test_buckets_belong_to_histograms_only() -> None:
    with pytest.raises(ValueError, match="only for histogram"):
        MetricFamily(unique("c"), "", MetricFamily.COUNTER).Metric(buckets=[1.0])


# -- validation ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "1abc", "has-dash", "has space", "é"])
def test_invalid_family_name_is_a_clear_error(name: str) -> None:
    with pytest.raises(ValueError, match="invalid metric family name"):
        MetricFamily(name, "", MetricFamily.COUNTER)


def test_invalid_kind_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="invalid metric family kind"):
        MetricFamily(unique("k"), "", 7)


@pytest.mark.parametrize("label", ["1a", "a-b", "__reserved"])
def test_invalid_label_name(label: str) -> None:
    with pytest.raises(ValueError, match="invalid metric label name"):
        MetricFamily(unique("l"), "", MetricFamily.GAUGE).Metric(labels={label: "x"})


def test_label_values_must_be_strings() -> None:
    family = MetricFamily(unique("l"), "", MetricFamily.GAUGE)
    with pytest.raises(TypeError):
        family.Metric(labels={"a": 1})  # type: ignore[dict-item]


def test_le_is_reserved_on_histograms() -> None:
    family = MetricFamily(unique("h"), "", MetricFamily.HISTOGRAM)
    with pytest.raises(ValueError, match="reserved"):
        family.Metric(labels={"le": "1"}, buckets=[1.0])


@pytest.mark.parametrize("buckets", [[2.0, 1.0], [1.0, 1.0], [float("nan")], [float("inf"), 1.0]])
def test_buckets_must_increase_and_be_finite(buckets: list[float]) -> None:
    family = MetricFamily(unique("h"), "", MetricFamily.HISTOGRAM)
    with pytest.raises(ValueError, match="buckets"):
        family.Metric(buckets=buckets)


# -- one series per name and labels ----------------------------------------------


def test_same_labels_return_the_same_series() -> None:
    family = MetricFamily(unique("c"), "", MetricFamily.COUNTER)
    first = family.Metric(labels={"a": "1", "b": "2"})
    assert family.Metric(labels={"b": "2", "a": "1"}) is first
    assert family.Metric(labels={"a": "2"}) is not first
    assert len(family.snapshot().series) == 2


def test_same_name_shares_series_and_must_agree() -> None:
    name = unique("shared")
    first = MetricFamily(name, "text", MetricFamily.COUNTER)
    second = MetricFamily(name, "text", MetricFamily.COUNTER)
    first.Metric(labels={"a": "1"}).increment(3)
    assert second.Metric(labels={"a": "1"}).value() == 3
    assert [f.name for f in MetricFamily.families()].count(name) == 1
    with pytest.raises(ValueError, match="different kind or description"):
        MetricFamily(name, "text", MetricFamily.GAUGE)


def test_same_histogram_labels_need_the_same_buckets() -> None:
    family = MetricFamily(unique("h"), "", MetricFamily.HISTOGRAM)
    family.Metric(buckets=[1.0, 2.0])
    assert family.Metric(buckets=[1, 2, float("inf")]) is family.Metric(buckets=[1.0, 2.0])
    with pytest.raises(ValueError, match="other buckets"):
        family.Metric(buckets=[1.0])


# -- histogram buckets -----------------------------------------------------------


def test_histogram_buckets_are_cumulative_with_inf() -> None:
    family = MetricFamily(unique("h"), "", MetricFamily.HISTOGRAM)
    metric = family.Metric(labels={"x": "y"}, buckets=[1.0, 2.5, 10.0])
    for value in (0.5, 1.0, 2.5, 7.0, 20.0):
        metric.observe(value)
    assert metric.snapshot() == SeriesSnapshot(
        labels={"x": "y"}, value=31.0, count=5,
        buckets=((1.0, 2), (2.5, 3), (10.0, 4), (float("inf"), 5)),
    )


def test_histogram_counts_every_observation_across_threads() -> None:
    metric = MetricFamily(unique("h"), "", MetricFamily.HISTOGRAM).Metric(buckets=[0.5])

    def observe() -> None:
        for _ in range(2000):
            metric.observe(1.0)
            metric.observe(0.0)

    threads = [threading.Thread(target=observe) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    snapshot = metric.snapshot()
    assert (snapshot.count, snapshot.value) == (32000, 16000.0)
    assert snapshot.buckets == ((0.5, 16000), (float("inf"), 32000))


# -- exposition ------------------------------------------------------------------


def test_families_render_like_triton_families() -> None:
    families = [
        FamilySnapshot("requests", "Requests seen", "counter",
                       (SeriesSnapshot({"zone": "z", "app": "a"}, 3.0),)),
        FamilySnapshot("depth", "Queue depth", "gauge", (SeriesSnapshot({}, 1.5),)),
        FamilySnapshot("latency", "Latency", "histogram", (SeriesSnapshot(
            {"zone": "z"}, 4.0, 3, ((1.0, 1), (2.5, 2), (float("inf"), 3))),)),
    ]
    assert rendered(families) == [
        "# HELP requests Requests seen",
        "# TYPE requests counter",
        'requests{app="a",zone="z"} 3.0',
        "# HELP depth Queue depth",
        "# TYPE depth gauge",
        "depth 1.5",
        "# HELP latency Latency",
        "# TYPE latency histogram",
        'latency_bucket{le="1.0",zone="z"} 1.0',
        'latency_bucket{le="2.5",zone="z"} 2.0',
        'latency_bucket{le="+Inf",zone="z"} 3.0',
        'latency_count{zone="z"} 3.0',
        'latency_sum{zone="z"} 4.0',
    ]


def test_snapshots_from_metric_families_render() -> None:
    name = unique("live")
    MetricFamily(name, "live counter", MetricFamily.COUNTER).Metric(labels={"m": "x"}).increment(4)
    lines = rendered(f for f in MetricFamily.snapshots() if f.name == name)
    assert lines == [f"# HELP {name} live counter", f"# TYPE {name} counter",
                     f'{name}{{m="x"}} 4.0']


def test_a_family_named_like_a_triton_family_is_left_out() -> None:
    clash = FamilySnapshot("nv_inference_count", "mine", "counter", (SeriesSnapshot({}, 9.0),))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CustomCollector(lambda: [clash]))
    assert render(registry) == b""
