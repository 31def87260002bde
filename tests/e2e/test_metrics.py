"""/metrics and the statistics extension report exactly the traffic a server saw."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.observe import Records, metric, wait_for_metric, wait_until
from tests.server_process import TritiumProcess
from tests.zoo import _parameter, _tensor, add_model

IO = _tensor("input", "INPUT0", "FP32", "1") + _tensor("output", "OUTPUT0", "FP32", "1")
REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")


@pytest.fixture(scope="module")
def metered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritiumProcess]:
    repo = tmp_path_factory.mktemp("metered")
    records = tmp_path_factory.mktemp("metered_records")
    add_model(repo, "identity", "identity", IO)
    add_model(repo, "raises", "raises", IO)
    add_model(repo, "slow", "slow", IO + _parameter("record_file", f"{records}/slow.jsonl"))
    add_model(repo, "bounded", "batch_record",
              "max_batch_size: 1\ndynamic_batching { default_queue_policy { max_queue_size: 1 } }\n"
              + IO + _parameter("record_file", f"{records}/bounded.jsonl"))
    server = TritiumProcess(repo).start()
    server.records = records  # type: ignore[attr-defined]
    yield server
    assert server.stop() == 0


def value(server: TritiumProcess, name: str, **labels: str) -> float:
    return metric(server.metrics_url, name, **labels)


def infer(server: TritiumProcess, model: str, seconds: float = 0.0) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("INPUT0", [1] if model != "bounded" else [1, 1], "FP32")
    tensor.set_data_from_numpy(np.full(tensor.shape(), seconds, dtype=np.float32))
    client.infer(model, [tensor])


def test_series_exist_at_zero_once_loaded(metered: TritiumProcess) -> None:
    text = requests.get(metered.metrics_url, timeout=10).text
    assert "# TYPE nv_inference_request_success counter" in text
    for reason in REASONS:
        assert (f'nv_inference_request_failure{{model="slow",reason="{reason}",version="1"}} 0'
                in text)
    assert 'nv_inference_pending_request_count{model="identity",version="1"} 0' in text
    assert value(metered, "nv_model_load_duration_secs", model="identity") > 0


def test_successes_and_backend_failures_are_counted(metered: TritiumProcess) -> None:
    for _ in range(3):
        infer(metered, "identity")
    for _ in range(2):
        with pytest.raises(InferenceServerException):
            infer(metered, "raises")
    assert value(metered, "nv_inference_request_success", model="identity") == 3
    assert value(metered, "nv_inference_count", model="identity") == 3
    assert value(metered, "nv_inference_exec_count", model="identity") == 3
    assert value(metered, "nv_inference_request_duration_us", model="identity") > 0
    assert value(metered, "nv_inference_request_failure", model="raises", reason="BACKEND") == 2
    assert value(metered, "nv_inference_request_success", model="raises") == 0
    assert value(metered, "nv_inference_request_failure", model="identity", reason="BACKEND") == 0


def _leave_after(server: TritiumProcess, body: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.http_port))
    sock.sendall(b"POST /v2/models/slow/infer HTTP/1.1\r\nHost: m\r\nContent-Length: %d\r\n\r\n%s"
                 % (len(body), body))
    return sock


def _slow_body(request_id: str, seconds: float) -> bytes:
    return (b'{"id": "%s", "inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", '
            b'"data": [%f]}]}' % (request_id.encode(), seconds))


def test_cancellations_are_counted_by_stage(metered: TritiumProcess) -> None:
    records = Records(metered.records / "slow.jsonl")  # type: ignore[attr-defined]
    running, waiting = uuid.uuid4().hex, uuid.uuid4().hex
    first = _leave_after(metered, _slow_body(running, 30))
    records.wait_for(running, "start")
    second = _leave_after(metered, _slow_body(waiting, 0))
    wait_for_metric(metered.metrics_url, "nv_inference_pending_request_count", 1, model="slow")
    second.close()
    wait_for_metric(metered.metrics_url, "tritium_inference_cancellation", 1, model="slow",
                    reason="CLIENT_DISCONNECTED", stage="queued")
    first.close()
    records.wait_for(running, "cancelled")
    wait_for_metric(metered.metrics_url, "tritium_inference_cancellation", 1, model="slow",
                    reason="CLIENT_DISCONNECTED", stage="executing")
    wait_for_metric(metered.metrics_url, "nv_inference_request_failure", 2, model="slow",
                    reason="CANCELED")
    wait_for_metric(metered.metrics_url, "tritium_cancellation_stop_delay_ms_count", 1,
                    model="slow")
    assert value(metered, "nv_inference_pending_request_count", model="slow") == 0
    assert value(metered, "nv_inference_exec_count", model="slow") == 1
    assert records.events(waiting) == []


def test_queue_overflow_is_counted_as_rejected(metered: TritiumProcess) -> None:
    with ThreadPoolExecutor(2) as pool:
        busy = pool.submit(infer, metered, "bounded", 1.0)
        records = Path(metered.records) / "bounded.jsonl"  # type: ignore[attr-defined]
        wait_until(lambda: records.exists() and '"start"' in records.read_text(),
                   "the first request to start")
        queued = pool.submit(infer, metered, "bounded", 0.0)
        wait_for_metric(metered.metrics_url, "nv_inference_pending_request_count", 1,
                        model="bounded")
        with pytest.raises(InferenceServerException) as caught:
            infer(metered, "bounded")
        assert caught.value.status() == "503"
        busy.result(30)
        queued.result(30)
    assert value(metered, "nv_inference_request_failure", model="bounded", reason="REJECTED") == 1
    assert value(metered, "nv_inference_request_success", model="bounded") == 2


def test_statistics_extension_matches_metrics_on_both_protocols(metered: TritiumProcess) -> None:
    http = httpclient.InferenceServerClient(metered.http_url)
    grpc = grpcclient.InferenceServerClient(metered.grpc_url)
    http_stats = http.get_inference_statistics("identity")["model_stats"]
    grpc_stats = grpc.get_inference_statistics("identity", as_json=True)["model_stats"]
    successes = value(metered, "nv_inference_request_success", model="identity")
    assert successes >= 3
    for stats in (http_stats, grpc_stats):
        assert len(stats) == 1 and stats[0]["name"] == "identity"
        assert stats[0]["version"] == "1"
        assert int(stats[0]["inference_count"]) == successes
        assert int(stats[0]["inference_stats"]["success"]["count"]) == successes
        assert int(stats[0]["inference_stats"]["fail"].get("count", 0)) == 0
    raises = http.get_inference_statistics("raises")["model_stats"][0]
    assert raises["inference_stats"]["fail"]["count"] == 2
    everything = http.get_inference_statistics()["model_stats"]
    assert {s["name"] for s in everything} == {"identity", "raises", "slow", "bounded"}
    with pytest.raises(InferenceServerException):
        http.get_inference_statistics("no_such_model")


def test_metrics_can_be_turned_off(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    add_model(repo, "identity", "identity", IO)
    server = TritiumProcess(repo, "--allow-metrics=false").start()
    try:
        assert "metrics" not in server.ports
        assert "metrics endpoint" not in server.log()
    finally:
        assert server.stop() == 0
