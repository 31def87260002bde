"""Metric families a model creates with pb_utils.MetricFamily appear on /metrics."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient

from tests.e2e.conftest import instance_kinds
from tests.server_process import TritiumProcess
from tests.zoo import _tensor, add_model

LABELS = 'app="demo",zone="z1"'


@pytest.fixture(scope="module", params=instance_kinds())
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[TritiumProcess]:
    repo = tmp_path_factory.mktemp("custom_metrics")
    add_model(repo, "custom_metrics", "custom_metrics",
              _tensor("input", "INPUT0", "FP32", "-1") + _tensor("output", "OUTPUT0", "FP32", "-1"))
    add_model(repo, "metric_misuse", "metric_misuse",
              _tensor("input", "INPUT0", "BYTES", "1") + _tensor("output", "OUTPUT0", "BYTES", "1"))
    process = TritiumProcess(repo, "--python-instance-kind", request.param).start(timeout=120)
    yield process
    assert process.stop() == 0, process.log()


def scrape(server: TritiumProcess) -> list[str]:
    return requests.get(server.metrics_url, timeout=10).text.splitlines()


def infer(server: TritiumProcess, values: list[float]) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("INPUT0", [len(values)], "FP32")
    tensor.set_data_from_numpy(np.array(values, dtype=np.float32))
    client.infer("custom_metrics", [tensor])


def histogram(counts: tuple[int, int, int, int], total: str) -> list[str]:
    """As prometheus-cpp writes a histogram for Triton: count, sum, then the buckets with
    "le" after the other labels, counts as integers and bounds as C++ prints doubles."""
    name = "custom_metrics_input_value"
    bounds = ("1", "2.5", "10", "+Inf")
    return [f"{name}_count{{{LABELS}}} {counts[-1]}", f"{name}_sum{{{LABELS}}} {total}"] + [
        f'{name}_bucket{{{LABELS},le="{le}"}} {n}' for le, n in zip(bounds, counts, strict=True)]


def test_model_families_on_metrics_endpoint(server: TritiumProcess) -> None:
    before = scrape(server)
    assert "# HELP custom_metrics_requests Requests executed" in before
    assert "# TYPE custom_metrics_requests counter" in before
    assert "# TYPE custom_metrics_last_sum gauge" in before
    assert "# TYPE custom_metrics_input_value histogram" in before
    assert f"custom_metrics_requests{{{LABELS}}} 0" in before
    assert set(histogram((0, 0, 0, 0), "0")) <= set(before)

    infer(server, [0.5, 2.5, 7.0])
    infer(server, [20.0])

    after = scrape(server)
    assert f"custom_metrics_requests{{{LABELS}}} 2" in after
    assert f"custom_metrics_last_sum{{{LABELS}}} 20" in after
    # Cumulative "le" buckets: 2.5 falls in le="2.5"; 20 only in +Inf.
    lines = [line for line in after if line.startswith("custom_metrics_input_value")]
    assert lines == histogram((1, 2, 3, 4), "30")
    assert not any(line.startswith("custom_metrics_requests_total") for line in after)
    # Triton's own families are still there, next to the model's.
    assert 'nv_inference_request_success{model="custom_metrics",version="1"} 2.0' in after


@pytest.mark.parametrize(("case", "expected"), [
    ("negative_increment", "TritonModelException: Failed to increment metric value: "
     "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by non-negative "
     "values."),
    ("observe_gauge", "TritonModelException: Failed to observe metric value: "
     "TRITONSERVER_METRIC_KIND_GAUGE does not support Observe"),
    ("histogram_without_buckets",
     "TritonModelException: Failed to create metric. Missing required buckets."),
    ("other_kind", "TritonModelException: Error when creating MetricFamily: Family name "
     "already exists with different type"),
    ("family_deleted", "TritonModelException: Failed to set metric value: Invalid metric "
     "operation as the corresponding 'MetricFamily' has been deleted. The 'MetricFamily' "
     "object should be deleted AFTER its corresponding 'Metric' objects have been deleted."),
])
def test_misuse_raises_triton_model_exception(server: TritiumProcess, case: str,
                                              expected: str) -> None:
    """What Triton's own custom_metrics QA model asserts: each misuse raises
    pb_utils.TritonModelException inside the model (Triton core refuses the operation and the
    stub prefixes the operation that failed; a cleared metric says its family was deleted)."""
    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("INPUT0", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([case.encode()], dtype=np.object_))
    result = client.infer("metric_misuse", [tensor]).as_numpy("OUTPUT0")
    assert result is not None
    assert result[0].decode() == expected
