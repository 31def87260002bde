"""--metrics-config on a running server: the duration counters left out, latency summaries
whose sum and count are what the counters would say, and the first response histogram."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.server_process import TritiumProcess
from tests.zoo import _tensor, add_model

IO = _tensor("input", "INPUT0", "FP32", "1") + _tensor("output", "OUTPUT0", "FP32", "1")
REQUESTS = 6
SUMMARIES = ("request", "queue", "compute_input", "compute_infer", "compute_output")
# Buckets of the first response histogram chosen by the model; a family that cannot be
# tuned is warned about.
TUNED = """model_metrics { metric_control [
  { metric_identifier { family: "nv_inference_first_response_histogram_ms" }
    histogram_options { buckets: [ 0, 60000 ] } },
  { metric_identifier { family: "nv_inference_count" }
    histogram_options { buckets: [ 1 ] } } ] }
"""
SAMPLE = re.compile(r'^(\w+)\{([^}]*)\} (\S+)$')


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritiumProcess]:
    repo = tmp_path_factory.mktemp("metrics_config")
    add_model(repo, "identity", "identity", IO)
    add_model(repo, "raises", "raises", IO)
    add_model(repo, "tuned", "identity", IO + TUNED)
    server = TritiumProcess(repo, "--metrics-config=counter_latencies=false",
                            "--metrics-config=summary_latencies=true",
                            "--metrics-config=summary_quantiles=0.5:0.01,0.99:0.001",
                            "--metrics-config=histogram_latencies=true").start()
    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros([1], dtype=np.float32))
    for _ in range(REQUESTS):
        client.infer("identity", [tensor])
        client.infer("tuned", [tensor])
    with pytest.raises(InferenceServerException):
        client.infer("raises", [tensor])
    yield server
    assert server.stop() == 0


def samples(server: TritiumProcess) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = requests.get(server.metrics_url, timeout=10).text
    found = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match:
            labels = frozenset(re.findall(r'(\w+)="([^"]*)"', match[2]))
            found[(match[1], labels)] = float(match[3])
    return found


def series(found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
           **labels: str) -> float:
    return found[(name, frozenset({"model": "identity", "version": "1", **labels}.items()))]


def stats(server: TritiumProcess) -> dict[str, dict[str, int]]:
    url = f"http://{server.http_url}/v2/models/identity/stats"
    inference: dict[str, dict[str, int]] = requests.get(
        url, timeout=10).json()["model_stats"][0]["inference_stats"]
    return inference


def test_counter_latencies_false_leaves_the_duration_counters_out(
        served: TritiumProcess) -> None:
    text = requests.get(served.metrics_url, timeout=10).text
    assert "_duration_us" not in text
    assert 'nv_inference_request_success{model="identity",version="1"} 6' in text
    assert 'nv_inference_exec_count{model="identity",version="1"}' in text


def test_summaries_count_what_the_counters_would(served: TritiumProcess) -> None:
    found = samples(served)
    expected = stats(served)
    for stage, key in zip(SUMMARIES, ("success", "queue", "compute_input", "compute_infer",
                                      "compute_output"), strict=True):
        name = f"nv_inference_{stage}_summary_us"
        assert series(found, f"{name}_count") == expected[key]["count"] == REQUESTS, name
        assert series(found, f"{name}_sum") == expected[key]["ns"] // 1000, name
        median = series(found, name, quantile="0.5")
        top = series(found, name, quantile="0.99")
        assert not math.isnan(median) and 0 <= median <= top, name
        # No quantile can be above the largest observation, which is at most the sum.
        assert top <= max(series(found, f"{name}_sum"), 1) * 1.01, name
    # The failed request is in no summary: its model's series count nothing yet.
    failed = frozenset({"model": "raises", "version": "1"}.items())
    assert found[("nv_inference_request_summary_us_count", failed)] == 0
    assert math.isnan(found[("nv_inference_request_summary_us",
                             failed | {("quantile", "0.5")})])


def test_summary_text_is_prometheus_summary(served: TritiumProcess) -> None:
    text = requests.get(served.metrics_url, timeout=10).text
    assert "# TYPE nv_inference_request_summary_us summary" in text
    lines = [line for line in text.splitlines()
             if line.startswith("nv_inference_queue_summary_us") and "identity" in line]
    # count, sum, then one line per quantile asked for (labels sorted by name, as on
    # every other family here).
    assert [line.split("{")[0] for line in lines] == [
        "nv_inference_queue_summary_us_count", "nv_inference_queue_summary_us_sum",
        "nv_inference_queue_summary_us", "nv_inference_queue_summary_us"]
    assert lines[2].startswith(
        'nv_inference_queue_summary_us{model="identity",quantile="0.5",version="1"} ')
    assert 'quantile="0.99"' in lines[3]


def buckets(found: dict[tuple[str, frozenset[tuple[str, str]]], float], model: str
            ) -> dict[str, float]:
    name = "nv_inference_first_response_histogram_ms_bucket"
    return {dict(labels)["le"]: value for (sample, labels), value in found.items()
            if sample == name and ("model", model) in labels}


def test_first_response_histogram(served: TritiumProcess) -> None:
    found = samples(served)
    name = "nv_inference_first_response_histogram_ms"
    for model in ("identity", "tuned"):
        labels = frozenset({"model": model, "version": "1"}.items())
        count = found[(f"{name}_count", labels)]
        assert count == REQUESTS, model
        counts = buckets(found, model)
        assert counts["+Inf"] == count, model
        values = list(counts.values())
        assert values == sorted(values), f"{model}: buckets are cumulative"
        assert 0 <= found[(f"{name}_sum", labels)] <= 60000 * count
    # Bounds as Triton prints them.
    assert list(buckets(found, "identity")) == ["100", "500", "2000", "5000", "+Inf"]
    tuned = buckets(found, "tuned")
    assert list(tuned) == ["0", "60000", "+Inf"]
    assert tuned["60000"] == REQUESTS  # every request answered within a minute
    # A failed request's error response is a first response too.
    raised = frozenset({"model": "raises", "version": "1"}.items())
    assert found[(f"{name}_count", raised)] == 1
    served.wait_for_line("Metric family 'nv_inference_count' in 'metric_identifier' is not a "
                         "customizable metric in Triton core.")
