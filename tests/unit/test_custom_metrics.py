"""pb_utils.MetricFamily kinds and histograms, and how the collector prints them."""

from __future__ import annotations

import math
import re
import threading
import uuid
from collections.abc import Iterable

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from tritium.backends.python.errors import TritonModelException
from tritium.backends.python.metric import Bucket, FamilySnapshot, MetricFamily, SeriesSnapshot
from tritium.metrics.collector import CustomCollector, FamilyView, TritonCollector, format_value
from tritium.metrics.server import render


def unique(prefix: str) -> str:
    # The registry is process-wide: each test uses names no other test has used.
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def exact(text: str) -> str:
    return f"^{re.escape(text)}$"


def rendered(families: Iterable[FamilyView]) -> list[str]:
    return CustomCollector(lambda: families).render().splitlines()


# -- kinds: Triton's errors ------------------------------------------------------


def test_counter_only_increments_upward() -> None:
    """Triton core's Metric::Increment refuses a negative counter step as INVALID_ARG, and
    Set/Observe on a counter as UNSUPPORTED; the stub raises each as TritonModelException,
    prefixed with the operation that failed (python_backend metric.cc)."""
    family = MetricFamily(unique("c"), "", MetricFamily.COUNTER)
    metric = family.Metric()
    metric.increment(2)
    metric.increment(0.5)
    assert metric.value() == 2.5
    with pytest.raises(TritonModelException) as negative:
        metric.increment(-1)
    assert str(negative.value) == (
        "Failed to increment metric value: TRITONSERVER_METRIC_KIND_COUNTER can only be "
        "incremented monotonically by non-negative values.")
    with pytest.raises(TritonModelException, match=exact("Failed to set metric value: "
                       "TRITONSERVER_METRIC_KIND_COUNTER does not support Set")):
        metric.set(1)
    with pytest.raises(TritonModelException, match="COUNTER does not support Observe"):
        metric.observe(1)
    assert metric.value() == 2.5


def test_gauge_sets_and_increments_both_ways() -> None:
    family = MetricFamily(unique("g"), "", MetricFamily.GAUGE)
    metric = family.Metric(labels={"a": "1"})
    metric.set(5)
    metric.increment(-2)
    assert metric.value() == 3
    with pytest.raises(TritonModelException, match=exact("Failed to observe metric value: "
                       "TRITONSERVER_METRIC_KIND_GAUGE does not support Observe")):
        metric.observe(1)


def test_histogram_needs_buckets_and_only_observes() -> None:
    """python_backend's CreateMetric: "Missing required buckets" without them (None too);
    core refuses Value/Increment/Set on a histogram."""
    family = MetricFamily(unique("h"), "", MetricFamily.HISTOGRAM)
    for call in (family.Metric, lambda: family.Metric(labels={}, buckets=None)):
        with pytest.raises(TritonModelException,
                           match=exact("Failed to create metric. Missing required buckets.")):
            call()
    metric = family.Metric(buckets=[1.0])
    for call, operation in ((metric.value, "Value"), (lambda: metric.increment(1), "Increment"),  # type: ignore[assignment]
                            (lambda: metric.set(1), "Set")):
        with pytest.raises(TritonModelException,
                           match=f"HISTOGRAM does not support {operation}$"):
            call()
    # An empty list is accepted: only the +Inf bucket.
    only_inf = family.Metric(labels={"e": "1"}, buckets=[]).snapshot().buckets
    assert only_inf == (Bucket(math.inf, 0),)


def test_buckets_belong_to_histograms_only_and_are_a_list() -> None:
    with pytest.raises(TritonModelException, match="Unexpected buckets found"):
        MetricFamily(unique("c"), "", MetricFamily.COUNTER).Metric(buckets=[1.0])
    with pytest.raises(TritonModelException, match="Buckets must be a list"):
        MetricFamily(unique("h"), "", MetricFamily.HISTOGRAM).Metric(buckets=(1.0,))  # type: ignore[arg-type]


def test_a_metric_of_a_deleted_family_raises_tritons_text() -> None:
    """Triton's stub clears a family's metrics when the family is deleted; a cleared metric
    refuses every operation with "Invalid metric operation as the corresponding
    'MetricFamily' has been deleted." (metric.cc CheckIfCleared)."""
    name = unique("gone")
    family = MetricFamily(name, "", MetricFamily.GAUGE)
    metric = family.Metric(labels={"a": "1"})
    second = MetricFamily(name, "", MetricFamily.GAUGE)
    other = second.Metric(labels={"a": "1"})
    del family
    gone = "Invalid metric operation as the corresponding 'MetricFamily' has been deleted."
    for call, prefix in ((lambda: metric.set(1), "set"), (lambda: metric.increment(1),
                                                          "increment"),
                         (metric.value, "get")):
        with pytest.raises(TritonModelException) as raised:
            call()
        assert str(raised.value).startswith(f"Failed to {prefix} metric value: {gone}")
    # A handle from another family object of the same name keeps working.
    other.set(4)
    assert other.value() == 4
    # Chained, the family is gone at once and so is its metric, as in Triton (pybind11
    # keeps no family alive for its metrics).
    with pytest.raises(TritonModelException, match="has been deleted"):
        MetricFamily(name, "", MetricFamily.GAUGE).Metric().set(1)
    assert second is not None


# -- validation ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "1abc", "has-dash", "has space", "é"])
def test_invalid_family_name_is_a_clear_error(name: str) -> None:
    with pytest.raises(TritonModelException,
                       match=exact("Error when creating MetricFamily: Invalid metric name")):
        MetricFamily(name, "", MetricFamily.COUNTER)


@pytest.mark.parametrize("kind", [7, "counter", None, 1.0])
def test_invalid_kind_is_a_type_error(kind: object) -> None:
    with pytest.raises(TypeError, match="invalid metric family kind"):
        MetricFamily(unique("k"), "", kind)  # type: ignore[arg-type]


@pytest.mark.parametrize("label", ["1a", "a-b", "__reserved"])
def test_invalid_label_name(label: str) -> None:
    with pytest.raises(TritonModelException, match="Invalid label name"):
        MetricFamily(unique("l"), "", MetricFamily.GAUGE).Metric(labels={label: "x"})


def test_labels_must_be_a_dict_of_strings() -> None:
    family = MetricFamily(unique("l"), "", MetricFamily.GAUGE)
    with pytest.raises(TritonModelException, match="Labels must be a dictionary"):
        family.Metric(labels=[("a", "1")])  # type: ignore[arg-type]
    with pytest.raises(TritonModelException, match="Error when creating Metric"):
        family.Metric(labels={"a": 1})  # type: ignore[dict-item]


def test_values_must_be_numbers() -> None:
    family = MetricFamily(unique("g"), "", MetricFamily.GAUGE)
    metric = family.Metric()
    with pytest.raises(TypeError):
        metric.set("1")  # type: ignore[arg-type]
    metric.set(np.float32(2.5))  # type: ignore[arg-type]
    assert metric.value() == 2.5


def test_le_is_reserved_on_histograms() -> None:
    family = MetricFamily(unique("h"), "", MetricFamily.HISTOGRAM)
    with pytest.raises(TritonModelException, match="Invalid label name"):
        family.Metric(labels={"le": "1"}, buckets=[1.0])


@pytest.mark.parametrize("buckets", [[2.0, 1.0], [1.0, 1.0], [float("nan")], [float("inf"), 1.0],
                                     [2.5, 0.1, 1.0, 10.0, 5.0], [1, 1, 2, 5, 5]])
def test_buckets_must_increase_and_be_finite(buckets: list[float]) -> None:
    family = MetricFamily(unique("h"), "", MetricFamily.HISTOGRAM)
    with pytest.raises(TritonModelException, match=exact("Error when creating Metric: Bucket "
                       "Boundaries must be strictly sorted")):
        family.Metric(buckets=buckets)


# -- one series per name and labels ----------------------------------------------


def test_same_labels_name_the_same_series() -> None:
    family = MetricFamily(unique("c"), "", MetricFamily.COUNTER)
    first = family.Metric(labels={"a": "1", "b": "2"})
    again = family.Metric(labels={"b": "2", "a": "1"})
    first.increment(7.5)
    assert again.value() == 7.5
    assert family.Metric(labels={"a": "2"}).value() == 0
    assert len(family.snapshot().series) == 2


def test_same_name_shares_series_keeps_first_description_refuses_other_kind() -> None:
    """prometheus-cpp's registry returns the existing family for a known name (its first
    help text stays) and throws "Family name already exists with different type" for
    another kind, which Triton's stub raises as TritonModelException."""
    name = unique("shared")
    first = MetricFamily(name, "first description", MetricFamily.COUNTER)
    second = MetricFamily(name, "second description", MetricFamily.COUNTER)
    first.Metric(labels={"a": "1"}).increment(3)
    assert second.Metric(labels={"a": "1"}).value() == 3
    assert [f.name for f in MetricFamily.families()].count(name) == 1
    assert second.snapshot().description == "first description"
    with pytest.raises(TritonModelException, match=exact("Error when creating MetricFamily: Family "
                       "name already exists with different type")):
        MetricFamily(name, "first description", MetricFamily.GAUGE)


def test_same_histogram_labels_keep_their_first_buckets() -> None:
    family = MetricFamily(unique("h"), "", MetricFamily.HISTOGRAM)
    family.Metric(buckets=[1.0, 2.0])
    assert family.Metric(buckets=[5.0]).snapshot().buckets == (
        Bucket(1.0, 0), Bucket(2.0, 0), Bucket(math.inf, 0))


# -- histogram buckets -----------------------------------------------------------


def test_histogram_buckets_are_cumulative_with_inf() -> None:
    family = MetricFamily(unique("h"), "", MetricFamily.HISTOGRAM)
    metric = family.Metric(labels={"x": "y"}, buckets=[1.0, 2.5, 10.0])
    for value in (0.5, 1.0, 2.5, 7.0, 20.0):
        metric.observe(value)
    assert metric.snapshot() == SeriesSnapshot(
        labels={"x": "y"}, value=31.0, count=5,
        buckets=(Bucket(1.0, 2), Bucket(2.5, 3), Bucket(10.0, 4), Bucket(float("inf"), 5)),
    )


def test_histogram_counts_every_observation_across_threads() -> None:
    family = MetricFamily(unique("h"), "", MetricFamily.HISTOGRAM)
    metric = family.Metric(buckets=[0.5])

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
    assert snapshot.buckets == (Bucket(0.5, 16000), Bucket(float("inf"), 32000))


# -- exposition ------------------------------------------------------------------


def test_families_render_like_triton_families() -> None:
    """prometheus-cpp's text serializer, which Triton's /metrics uses: HELP only when there
    is help, labels sorted with "le" appended last, count and sum before the buckets, counts
    as integers and doubles at 16 significant digits, so Triton's tests find
    `le="1"} 0` and `_sum{...} 7.55`."""
    families = [
        FamilySnapshot("requests", "Requests seen", "counter",
                       (SeriesSnapshot({"zone": "z", "app": "a"}, 3.0),)),
        FamilySnapshot("depth", "", "gauge", (SeriesSnapshot({}, 1.5),)),
        FamilySnapshot("latency", "Latency\nin s", "histogram", (SeriesSnapshot(
            {"zone": "z", "app": 'a"b'}, 0.05 + 1.5 + 6.0, 3,
            (Bucket(0.1, 1), Bucket(1.0, 1), Bucket(2.5, 2), Bucket(float("inf"), 3))),)),
    ]
    assert rendered(families) == [
        "# HELP requests Requests seen",
        "# TYPE requests counter",
        'requests{app="a",zone="z"} 3',
        "# TYPE depth gauge",
        "depth 1.5",
        "# HELP latency Latency\\nin s",
        "# TYPE latency histogram",
        'latency_count{app="a\\"b",zone="z"} 3',
        'latency_sum{app="a\\"b",zone="z"} 7.55',
        'latency_bucket{app="a\\"b",zone="z",le="0.1"} 1',
        'latency_bucket{app="a\\"b",zone="z",le="1"} 1',
        'latency_bucket{app="a\\"b",zone="z",le="2.5"} 2',
        'latency_bucket{app="a\\"b",zone="z",le="+Inf"} 3',
    ]


@pytest.mark.parametrize(("value", "text"), [(0.0, "0"), (2023.0, "2023"), (-23.5, "-23.5"),
                                             (1e20, "1e+20"), (float("nan"), "Nan"),
                                             (float("-inf"), "-Inf")])
def test_values_print_as_cpp_streams_print_them(value: float, text: str) -> None:
    assert format_value(value) == text


def test_snapshots_from_metric_families_render() -> None:
    name = unique("live")
    family = MetricFamily(name, "live counter", MetricFamily.COUNTER)
    family.Metric(labels={"m": "x"}).increment(4)
    lines = rendered(f for f in MetricFamily.snapshots() if f.name == name)
    assert lines == [f"# HELP {name} live counter", f"# TYPE {name} counter",
                     f'{name}{{m="x"}} 4']


def test_a_family_named_like_a_triton_family_is_left_out() -> None:
    clash = FamilySnapshot("nv_inference_count", "mine", "counter", (SeriesSnapshot({}, 9.0),))
    assert CustomCollector(lambda: [clash]).render() == ""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TritonCollector(lambda: ()))
    text = render(registry, CustomCollector(lambda: [clash])).decode()
    assert "mine" not in text and "# TYPE nv_inference_count counter" in text
