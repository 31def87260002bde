"""Ensembles served end to end over HTTP and gRPC: data flow, streaming, what reaches each
step, statistics, batching and BLS on either side."""

from __future__ import annotations

import json
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tests.e2e.ensemble_zoo import ensemble_records, ensemble_server  # noqa: F401 - fixtures
from tests.e2e.observe import metric, wait_until
from tests.server_process import TritiumProcess

PROTOCOLS = ("http", "grpc")
Result = Any  # tritonclient's InferResult of either protocol


def infer(server: TritiumProcess, protocol: str, model: str, arrays: dict[str, np.ndarray],
          outputs: list[str] | None = None, **options: Any) -> Result:
    module: Any = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server.http_url if protocol == "http"
                                          else server.grpc_url)
    tensors = []
    for name, array in arrays.items():
        tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    requested = [module.InferRequestedOutput(name) for name in outputs] if outputs else None
    try:
        return client.infer(model, tensors, outputs=requested, **options)
    finally:
        client.close()


def stats(server: TritiumProcess, model: str) -> dict[str, Any]:
    reply = requests.get(f"http://{server.http_url}/v2/models/{model}/stats", timeout=10)
    assert reply.status_code == 200, reply.text
    (entry,) = reply.json()["model_stats"]
    return entry


def successes(server: TritiumProcess, model: str) -> int:
    return int(stats(server, model)["inference_stats"]["success"]["count"])


def fp32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


@pytest.fixture
def server(ensemble_server: TritiumProcess) -> TritiumProcess:  # noqa: F811
    return ensemble_server


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_two_step_ensemble_answers_with_its_last_steps_output(
        server: TritiumProcess, protocol: str) -> None:
    before = {m: successes(server, m) for m in ("two_step", "ident_a", "ident_b")}
    result = infer(server, protocol, "two_step", {"INPUT0": fp32(1, 2, 3)}, request_id="two")
    assert result.as_numpy("OUTPUT0").tolist() == [1, 2, 3]
    response = result.get_response()
    name = response["model_name"] if protocol == "http" else response.model_name
    assert name == "two_step"
    assert {m: successes(server, m) - n for m, n in before.items()} == {
        "two_step": 1, "ident_a": 1, "ident_b": 1}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_ensemble_can_be_a_step_of_another(server: TritiumProcess, protocol: str) -> None:
    before = {m: successes(server, m) for m in ("nested", "two_step", "ident_a", "ident_b")}
    result = infer(server, protocol, "nested", {"INPUT0": fp32(9, 8)})
    assert result.as_numpy("OUTPUT0").tolist() == [9, 8]
    assert {m: successes(server, m) - n for m, n in before.items()} == {
        "nested": 1, "two_step": 1, "ident_a": 2, "ident_b": 1}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_diamond_runs_both_branches_and_joins_them(server: TritiumProcess,
                                                     protocol: str) -> None:
    steps = ("split", "branch_left", "branch_right", "join")
    before = {m: successes(server, m) for m in steps}
    a, b = np.arange(16, dtype=np.float32), np.full(16, 3, dtype=np.float32)
    result = infer(server, protocol, "diamond", {"INPUT0": a, "INPUT1": b})
    # split: (a+b, a-b); join: (a+b)+(a-b) = 2a and (a+b)-(a-b) = 2b
    assert result.as_numpy("OUTPUT0").tolist() == (2 * a).tolist()
    assert result.as_numpy("OUTPUT1").tolist() == (2 * b).tolist()
    assert all(successes(server, m) == before[m] + 1 for m in steps)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_only_the_requested_outputs_are_answered(server: TritiumProcess, protocol: str) -> None:
    a, b = np.ones(16, dtype=np.float32), np.zeros(16, dtype=np.float32)
    result = infer(server, protocol, "diamond", {"INPUT0": a, "INPUT1": b}, outputs=["OUTPUT1"])
    assert result.as_numpy("OUTPUT1").tolist() == [0.0] * 16
    assert result.as_numpy("OUTPUT0") is None


def test_an_ensemble_with_a_decoupled_step_is_decoupled(server: TritiumProcess) -> None:
    """Triton marks an ensemble decoupled in its config when any step's model is; clients
    read the flag to choose a streaming call. One with no decoupled step is not."""
    def config(model: str) -> dict[str, Any]:
        reply = requests.get(f"http://{server.http_url}/v2/models/{model}/config", timeout=10)
        return reply.json()
    assert config("streaming")["model_transaction_policy"]["decoupled"] is True
    assert not config("two_step").get("model_transaction_policy", {}).get("decoupled")
    reply = requests.post(f"http://{server.http_url}/v2/models/streaming/infer", timeout=10,
                          json={"inputs": [
                              {"name": "COUNT", "shape": [1], "datatype": "INT32", "data": [2]},
                              {"name": "DELAY", "shape": [1], "datatype": "FP32", "data": [0]}]})
    # Refused as for any decoupled model (the status is the frontend's table's to choose).
    assert reply.status_code != 200 and "decoupled" in reply.json()["error"], reply.text


def test_generate_stream_on_a_decoupled_ensemble_streams_token_by_token(
        server: TritiumProcess) -> None:
    """Each response of the decoupled step flows through the next step and out at once:
    the first event arrives while later ones are still being produced (150 ms apart)."""
    url = f"http://{server.http_url}/v2/models/streaming/generate_stream"
    arrivals, values = [], []
    with requests.post(url, json={"COUNT": 4, "DELAY": 150}, stream=True, timeout=30) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith(b"data: "):
                arrivals.append(time.monotonic())
                values.append(json.loads(line[6:])["OUTPUT0"])
    assert values == [0, 1, 2, 3]
    assert arrivals[-1] - arrivals[0] > 0.3, arrivals


def test_model_stream_infer_on_a_decoupled_ensemble_streams_token_by_token(
        server: TritiumProcess) -> None:
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    count, delay = grpcclient.InferInput("COUNT", [1], "INT32"), grpcclient.InferInput(
        "DELAY", [1], "FP32")
    count.set_data_from_numpy(np.array([4], dtype=np.int32))
    delay.set_data_from_numpy(fp32(150))
    try:
        client.start_stream(lambda result, error: results.put((result, error)))
        client.async_stream_infer("streaming", [count, delay], request_id="s",
                                  enable_empty_final_response=True)
        arrivals, values = [], []
        while True:
            result, error = results.get(timeout=30)
            assert error is None, error
            response = result.get_response()
            if response.outputs:
                arrivals.append(time.monotonic())
                values.append(int(result.as_numpy("OUTPUT0")[0]))
            if response.parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
        client.close()
    assert values == [0, 1, 2, 3]
    assert arrivals[-1] - arrivals[0] > 0.3, arrivals


def test_ensemble_statistics_sum_their_steps_and_every_model_has_its_metrics(
        server: TritiumProcess) -> None:
    """Triton reports an ensemble's own requests in its stats, with the compute times of
    its steps summed into its compute_infer; each composing model keeps its own figures
    (stats and metrics), where the ensemble's steps count like any request."""
    before = stats(server, "two_step")
    metric_before = {m: metric(server.metrics_url, "nv_inference_request_success", model=m)
                     for m in ("two_step", "ident_a", "ident_b")}
    for _ in range(3):
        infer(server, "http", "two_step", {"INPUT0": fp32(5)})
    after = stats(server, "two_step")
    for field in ("inference_count", "execution_count"):
        assert after[field] - before[field] == 3
    infer_stats, earlier = after["inference_stats"], before["inference_stats"]
    assert infer_stats["success"]["count"] - earlier["success"]["count"] == 3
    assert infer_stats["compute_infer"]["count"] - earlier["compute_infer"]["count"] == 3
    assert infer_stats["compute_infer"]["ns"] > earlier["compute_infer"]["ns"]
    assert infer_stats["success"]["ns"] - earlier["success"]["ns"] >= (
        infer_stats["compute_infer"]["ns"] - earlier["compute_infer"]["ns"])
    for model, value in metric_before.items():
        assert metric(server.metrics_url, "nv_inference_request_success",
                      model=model) == value + 3, model


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_failing_step_fails_the_ensemble_in_its_name(server: TritiumProcess,
                                                       protocol: str) -> None:
    """Triton words a step's error "in ensemble '<name>', <the step's error>" and counts the
    ensemble's failure with reason OTHER."""
    before = metric(server.metrics_url, "nv_inference_request_failure", model="failing",
                    reason="OTHER")
    with pytest.raises(InferenceServerException) as caught:
        infer(server, protocol, "failing", {"INPUT0": fp32(1)})
    message = caught.value.message()
    assert message.startswith("in ensemble 'failing', "), message
    assert "this model always fails" in message
    assert metric(server.metrics_url, "nv_inference_request_failure", model="failing",
                  reason="OTHER") == before + 1


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_requests_parameters_reach_its_steps(server: TritiumProcess, protocol: str) -> None:
    result = infer(server, protocol, "echo_params", {"INPUT0": fp32(1)},
                   parameters={"custom": "yes"})
    seen = json.loads(result.as_numpy("PARAMS")[0])
    assert seen["custom"] == "yes"


def test_the_requests_timeout_reaches_its_steps_queue(server: TritiumProcess,
                                                      ensemble_records: Path) -> None:  # noqa: F811
    """The ensemble request's timeout is its steps' (as Triton forwards it): queued behind
    a busy instance, the step expires and the ensemble answers with its error."""
    blocker = threading.Thread(target=infer, args=(server, "http", "timed",
                                                   {"INPUT0": np.array([[1.5]], np.float32)}),
                               kwargs={"request_id": "blocker"})
    blocker.start()
    record = ensemble_records / "timed.jsonl"
    wait_until(lambda: record.exists() and "blocker" in record.read_text(), "the blocker runs")
    with pytest.raises(InferenceServerException) as caught:
        infer(server, "grpc", "timed_ensemble", {"INPUT0": np.array([[0.0]], np.float32)},
              request_id="expires", timeout=200_000)
    assert caught.value.message() == "in ensemble 'timed_ensemble', Request timeout expired"
    blocker.join(30)
    assert "expires" not in record.read_text()


def test_steps_join_their_models_dynamic_batches(server: TritiumProcess,
                                                 ensemble_records: Path) -> None:  # noqa: F811
    """Requests from the ensemble wait in the composing model's own queue: two through the
    ensemble and one sent to the model directly are executed as one batch (500 ms window)."""
    calls = [("batched_ensemble", "via_1"), ("batched_ensemble", "via_2"), ("batched", "direct")]
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(infer, server, "http", model, {"INPUT0": np.array([[0.0]],
                                                                                np.float32)},
                               request_id=rid) for model, rid in calls]
        for future in futures:
            assert future.result().as_numpy("OUTPUT0").tolist() == [[0.0]]
    rows = [json.loads(line) for line in (ensemble_records / "batched.jsonl").read_text()
            .splitlines()]
    batches = [sorted(row["ids"]) for row in rows if row["event"] == "execute"]
    assert batches[-1] == ["direct", "via_1", "via_2"], batches


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bls_can_call_an_ensemble(server: TritiumProcess, protocol: str) -> None:
    before = successes(server, "two_step")
    result = infer(server, protocol, "bls_to_two_step", {"INPUT0": fp32(4, 2)})
    assert result.as_numpy("OUTPUT0").tolist() == [4, 2]
    assert successes(server, "two_step") == before + 1


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_ensemble_can_include_a_bls_model(server: TritiumProcess, protocol: str) -> None:
    before = {m: successes(server, m) for m in ("bls_to_ident_b", "ident_b")}
    result = infer(server, protocol, "with_bls", {"INPUT0": fp32(7)})
    assert result.as_numpy("OUTPUT0").tolist() == [7]
    assert all(successes(server, m) == before[m] + 1 for m in before)
