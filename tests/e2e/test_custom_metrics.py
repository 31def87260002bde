"""Metric families a model creates with pb_utils.MetricFamily appear on /metrics."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient

from tests.server_process import TritiumProcess
from tests.zoo import _tensor, add_model

LABELS = 'app="demo",zone="z1"'


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritiumProcess]:
    repo = tmp_path_factory.mktemp("custom_metrics")
    add_model(repo, "custom_metrics", "custom_metrics",
              _tensor("input", "INPUT0", "FP32", "-1") + _tensor("output", "OUTPUT0", "FP32", "-1"))
    process = TritiumProcess(repo).start()
    yield process
    assert process.stop() == 0, process.log()


def scrape(server: TritiumProcess) -> list[str]:
    return requests.get(server.metrics_url, timeout=10).text.splitlines()


def infer(server: TritiumProcess, values: list[float]) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("INPUT0", [len(values)], "FP32")
    tensor.set_data_from_numpy(np.array(values, dtype=np.float32))
    client.infer("custom_metrics", [tensor])


def histogram(counts: tuple[int, int, int, int], total: float) -> list[str]:
    name = "custom_metrics_input_value"
    bounds = ("1.0", "2.5", "10.0", "+Inf")
    return [f'{name}_bucket{{app="demo",le="{le}",zone="z1"}} {n}.0'
            for le, n in zip(bounds, counts, strict=True)] + [
        f"{name}_count{{{LABELS}}} {counts[-1]}.0",
        f"{name}_sum{{{LABELS}}} {total}",
    ]


def test_model_families_on_metrics_endpoint(server: TritiumProcess) -> None:
    before = scrape(server)
    assert "# HELP custom_metrics_requests Requests executed" in before
    assert "# TYPE custom_metrics_requests counter" in before
    assert "# TYPE custom_metrics_last_sum gauge" in before
    assert "# TYPE custom_metrics_input_value histogram" in before
    assert f"custom_metrics_requests{{{LABELS}}} 0.0" in before
    assert set(histogram((0, 0, 0, 0), 0.0)) <= set(before)

    infer(server, [0.5, 2.5, 7.0])
    infer(server, [20.0])

    after = scrape(server)
    assert f"custom_metrics_requests{{{LABELS}}} 2.0" in after
    assert f"custom_metrics_last_sum{{{LABELS}}} 20.0" in after
    # Cumulative "le" buckets: 2.5 falls in le="2.5"; 20 only in +Inf.
    lines = [line for line in after if line.startswith("custom_metrics_input_value")]
    assert lines == histogram((1, 2, 3, 4), 30.0)
    assert not any(line.startswith("custom_metrics_requests_total") for line in after)
    # Triton's own families are still there, next to the model's.
    assert 'nv_inference_request_success{model="custom_metrics",version="1"} 2.0' in after
