"""Dynamic batching, queue policies, priorities and instance groups against a real server.

The models (tests/zoo.py ``BATCHING_MODELS``) run tests/models/batch_record.py, which
records every execute() call: its request ids, batch sizes, instance and times. A test
that needs requests to wait in the queue first occupies the model's single instance with
a request that sleeps, and waits for the queue length on /metrics before going on.
"""

from __future__ import annotations

import functools
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.e2e.observe import metric, wait_for_metric
from tests.server_process import TritiumProcess

PENDING = "nv_inference_pending_request_count"
BATCHED = {"batch_off", "batch_nodelay", "batch_window", "batch_preferred", "queue_priority",
           "queue_reject", "queue_delay", "queue_bounded", "batch_ordered"}


def counter(server: TritiumProcess, name: str, **labels: str) -> float:
    """A counter's value, whether or not the exposition adds prometheus' ``_total``."""
    return (metric(server.metrics_url, name, **labels)
            or metric(server.metrics_url, f"{name}_total", **labels))


def wait_for_counter(server: TritiumProcess, name: str, value: float, **labels: str) -> None:
    deadline = time.monotonic() + 10.0
    while (current := counter(server, name, **labels)) != value:
        if time.monotonic() > deadline:
            raise AssertionError(f"{name}{labels} is {current}, expected {value}")
        time.sleep(0.01)


def new_id(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:8]}"


def infer_body(model: str, request_id: str, seconds: float, batch: int = 1,
               **parameters: int) -> dict[str, Any]:
    shape = [batch, 1] if model in BATCHED else [1]
    body: dict[str, Any] = {
        "id": request_id,
        "inputs": [{"name": "INPUT0", "shape": shape, "datatype": "FP32",
                    "data": [seconds] * batch}],
    }
    if parameters:
        body["parameters"] = parameters
    return body


def infer(server: TritiumProcess, model: str, request_id: str, seconds: float = 0.0,
          batch: int = 1, **parameters: int) -> requests.Response:
    return requests.post(f"http://{server.http_url}/v2/models/{model}/infer",
                         json=infer_body(model, request_id, seconds, batch, **parameters),
                         timeout=60)


class ModelRecords:
    """What one batch_record model wrote: its execute() calls and instance starts."""

    def __init__(self, record_dir: Path, model: str):
        self.path = record_dir / f"{model}.jsonl"

    def entries(self, event: str) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        lines = self.path.read_text().splitlines()
        return [e for e in map(json.loads, lines) if e["event"] == event]

    def executions(self, request_ids: list[str]) -> list[dict[str, Any]]:
        """The finished execute() calls that had any of ``request_ids``, in start order."""
        wanted = set(request_ids)
        found = [e for e in self.entries("execute") if wanted & set(e["ids"])]
        return sorted(found, key=lambda e: e["start"])

    def batches(self, request_ids: list[str]) -> list[list[str]]:
        return [e["ids"] for e in self.executions(request_ids)]

    def wait_started(self, request_id: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(request_id in e["ids"] for e in self.entries("start")):
            if time.monotonic() > deadline:
                raise AssertionError(f"execute() never started for {request_id}")
            time.sleep(0.005)


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=16) as executor:
        yield executor


@contextmanager
def occupied(server: TritiumProcess, records: ModelRecords, model: str, pool: ThreadPoolExecutor,
             seconds: float) -> Iterator[str]:
    """The model's only instance is busy for ``seconds`` with one request; yields its id."""
    request_id = new_id("busy")
    done = pool.submit(infer, server, model, request_id, seconds)
    records.wait_started(request_id)
    yield request_id
    assert done.result().status_code == 200


def queue_up(server: TritiumProcess, pool: ThreadPoolExecutor, model: str,
             calls: list[Callable[[], Any]]) -> list[Future[Any]]:
    """Submit ``calls`` one at a time, each once the previous one is queued."""
    start = metric(server.metrics_url, PENDING, model=model)
    futures = []
    for index, call in enumerate(calls, start=1):
        futures.append(pool.submit(call))
        wait_for_metric(server.metrics_url, PENDING, start + index, model=model)
    return futures


# -- batching -------------------------------------------------------------------
def test_queued_requests_form_batches_up_to_max_batch_size(
        server: TritiumProcess, record_dir: Path, pool: ThreadPoolExecutor) -> None:
    model = "batch_nodelay"
    records = ModelRecords(record_dir, model)
    ids = [new_id("q") for _ in range(6)]
    execs_before = counter(server, "nv_inference_exec_count", model=model)
    with occupied(server, records, model, pool, 1.5):
        sizes = [2, 1, 2, 2, 1, 1]  # batch dimensions: 2+1+2+2 = 7, then 1 more fits 8
        futures = queue_up(server, pool, model, [
            functools.partial(infer, server, model, i, 0.0, batch=s)
            for i, s in zip(ids, sizes, strict=True)])
    assert all(f.result().status_code == 200 for f in futures)
    executions = records.executions(ids)
    assert [e["ids"] for e in executions] == [ids[:5], ids[5:]]
    assert [sum(e["sizes"]) for e in executions] == [8, 1]
    assert counter(server, "nv_inference_exec_count", model=model) == execs_before + 3


def test_one_client_without_delay_gets_batches_of_one(server: TritiumProcess,
                                                      record_dir: Path) -> None:
    records = ModelRecords(record_dir, "batch_nodelay")
    ids = [new_id("solo") for _ in range(4)]
    for request_id in ids:
        assert infer(server, "batch_nodelay", request_id).status_code == 200
    assert records.batches(ids) == [[i] for i in ids]


def test_without_dynamic_batching_each_execute_gets_one_request(
        server: TritiumProcess, record_dir: Path, pool: ThreadPoolExecutor) -> None:
    model = "batch_off"
    records = ModelRecords(record_dir, model)
    ids = [new_id("off") for _ in range(3)]
    with occupied(server, records, model, pool, 1.0):
        futures = queue_up(server, pool, model,
                           [functools.partial(infer, server, model, i) for i in ids])
    assert all(f.result().status_code == 200 for f in futures)
    assert records.batches(ids) == [[i] for i in ids]


def test_queue_delay_holds_a_batch_open_for_later_requests(
        server: TritiumProcess, record_dir: Path, pool: ThreadPoolExecutor) -> None:
    model = "batch_window"  # max_queue_delay 300 ms
    records = ModelRecords(record_dir, model)
    first, second = new_id("w1"), new_id("w2")
    sent = time.monotonic()
    futures = queue_up(server, pool, model, [lambda: infer(server, model, first),
                                             lambda: infer(server, model, second)])
    assert all(f.result().status_code == 200 for f in futures)
    (execution,) = records.executions([first, second])
    assert execution["ids"] == [first, second]
    waited = execution["start"] - sent
    assert 0.29 <= waited < 3.0, waited


def test_preferred_batch_size_goes_without_waiting_for_the_delay(
        server: TritiumProcess, record_dir: Path, pool: ThreadPoolExecutor) -> None:
    model = "batch_preferred"  # preferred 4, max_queue_delay 5 s
    records = ModelRecords(record_dir, model)
    ids = [new_id("p") for _ in range(4)]
    started = time.monotonic()
    futures = [pool.submit(infer, server, model, i) for i in ids]
    assert all(f.result().status_code == 200 for f in futures)
    assert time.monotonic() - started < 4.0
    assert [sorted(b) for b in records.batches(ids)] == [sorted(ids)]


def test_cancelled_requests_are_left_out_of_the_next_batch(
        server: TritiumProcess, record_dir: Path, pool: ThreadPoolExecutor) -> None:
    model = "batch_nodelay"
    records = ModelRecords(record_dir, model)
    kept, gone = [new_id("kept"), new_id("kept")], new_id("gone")
    labels = {"model": model, "reason": "CLIENT_DISCONNECTED", "stage": "queued"}
    cancelled = counter(server, "tritium_inference_cancellation", **labels)
    sock = socket.create_connection(("127.0.0.1", server.http_port))
    with occupied(server, records, model, pool, 1.5):
        futures = queue_up(server, pool, model, [
            lambda: infer(server, model, kept[0]),
            lambda: send_raw(sock, model, gone),
            lambda: infer(server, model, kept[1]),
        ])
        sock.close()
        wait_for_counter(server, "tritium_inference_cancellation", cancelled + 1, **labels)
    assert futures[0].result().status_code == 200 and futures[2].result().status_code == 200
    assert records.batches([*kept, gone]) == [kept]


def send_raw(sock: socket.socket, model: str, request_id: str) -> None:
    body = json.dumps(infer_body(model, request_id, 0.0)).encode()
    sock.sendall(f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: t\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                 .encode() + body)


# -- priorities and queue policies ------------------------------------------------
def test_higher_priority_runs_first_fifo_within_a_level(
        server: TritiumProcess, record_dir: Path, pool: ThreadPoolExecutor) -> None:
    model = "queue_priority"  # two levels, default 2
    records = ModelRecords(record_dir, model)
    low1, low2, high = new_id("low"), new_id("low"), new_id("high")
    with occupied(server, records, model, pool, 1.0):
        futures = queue_up(server, pool, model, [
            lambda: infer(server, model, low1, priority=2),
            lambda: infer(server, model, low2),
            lambda: infer(server, model, high, priority=1),
        ])
    assert all(f.result().status_code == 200 for f in futures)
    assert records.batches([low1, low2, high]) == [[high], [low1], [low2]]


def grpc_infer(server: TritiumProcess, model: str, request_id: str, seconds: float = 0.0,
               **parameters: int) -> Any:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        tensor = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.array([[seconds]], dtype=np.float32))
        return client.infer(model, [tensor], request_id=request_id,
                            timeout=parameters.get("timeout"))


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    started = time.monotonic()
    try:
        result = call()
    except InferenceServerException as exc:
        result = exc
    return time.monotonic() - started, result


def test_queue_timeout_reject_answers_unavailable(
        server: TritiumProcess, record_dir: Path, pool: ThreadPoolExecutor) -> None:
    model = "queue_reject"  # REJECT after 300 ms, the request may lower it
    records = ModelRecords(record_dir, model)
    ids = {k: new_id(k) for k in ("http", "grpc", "short")}
    rejected = counter(server, "nv_inference_request_failure", model=model, reason="REJECTED")
    with occupied(server, records, model, pool, 2.0):
        http = pool.submit(timed, lambda: infer(server, model, ids["http"]))
        grpc = pool.submit(timed, lambda: grpc_infer(server, model, ids["grpc"]))
        short = pool.submit(timed, lambda: infer(server, model, ids["short"], timeout=20_000))
        (http_s, response), (grpc_s, error), (short_s, short_response) = (
            http.result(), grpc.result(), short.result())
    assert response.status_code == 503
    assert response.json() == {"error": "Request timeout expired"}
    assert isinstance(error, InferenceServerException)
    assert error.status() == "StatusCode.UNAVAILABLE" and "timeout expired" in error.message()
    assert short_response.status_code == 503
    assert 0.29 <= http_s < 1.9 and 0.29 <= grpc_s < 1.9, (http_s, grpc_s)
    assert short_s < http_s
    assert records.batches(list(ids.values())) == []
    wait_for_counter(server, "nv_inference_request_failure", rejected + 3, model=model,
                     reason="REJECTED")


def test_queue_timeout_delay_moves_the_request_behind_the_others(
        server: TritiumProcess, record_dir: Path, pool: ThreadPoolExecutor) -> None:
    model = "queue_delay"  # DELAY after 30 s, the request may lower it
    records = ModelRecords(record_dir, model)
    expired, punctual = new_id("expired"), new_id("punctual")
    with occupied(server, records, model, pool, 1.0):
        futures = queue_up(server, pool, model, [
            lambda: infer(server, model, expired, timeout=20_000),
            lambda: infer(server, model, punctual),
        ])
    assert all(f.result().status_code == 200 for f in futures)
    assert records.batches([expired, punctual]) == [[punctual], [expired]]


def test_full_queue_rejects_at_once_with_503(
        server: TritiumProcess, record_dir: Path, pool: ThreadPoolExecutor) -> None:
    model = "queue_bounded"  # max_queue_size 1
    records = ModelRecords(record_dir, model)
    queued, extra, extra_grpc = new_id("queued"), new_id("extra"), new_id("extra")
    with occupied(server, records, model, pool, 1.0):
        (waiting,) = queue_up(server, pool, model, [lambda: infer(server, model, queued)])
        seconds, response = timed(lambda: infer(server, model, extra))
        _, error = timed(lambda: grpc_infer(server, model, extra_grpc))
        assert response.status_code == 503
        assert response.json() == {"error": "Exceeds maximum queue size"}
        assert isinstance(error, InferenceServerException)
        assert error.status() == "StatusCode.UNAVAILABLE"
        assert seconds < 0.9
    assert waiting.result().status_code == 200
    assert records.batches([queued, extra, extra_grpc]) == [[queued]]


# -- instance groups ------------------------------------------------------------
def test_instances_of_every_group_execute_in_parallel(
        server: TritiumProcess, record_dir: Path, pool: ThreadPoolExecutor) -> None:
    model = "instance_pool"  # group "pool" x2 and an unnamed group x1
    records = ModelRecords(record_dir, model)
    inits = records.entries("init")
    assert sorted(e["instance"] for e in inits) == ["instance_pool_1_0", "pool_0", "pool_1"]
    assert {(e["kind"], e["device_id"]) for e in inits} == {("CPU", "0")}
    ids = [new_id("par") for _ in range(3)]
    barrier = threading.Barrier(3)

    def call(request_id: str) -> requests.Response:
        barrier.wait(timeout=10)
        return infer(server, model, request_id, 0.6)

    futures = [pool.submit(call, i) for i in ids]
    assert all(f.result().status_code == 200 for f in futures)
    executions = records.executions(ids)
    assert len({e["instance"] for e in executions}) == 3
    assert max(e["start"] for e in executions) < min(e["end"] for e in executions)


@pytest.mark.parametrize(("model", "ordered"), [("batch_ordered", True),
                                               ("instance_pool", False)])
def test_preserve_ordering_holds_back_a_later_quicker_response(
        server: TritiumProcess, record_dir: Path, pool: ThreadPoolExecutor, model: str,
        ordered: bool) -> None:
    records = ModelRecords(record_dir, model)
    slow_id, quick_id = new_id("first"), new_id("second")
    answered: dict[str, float] = {}

    def call(request_id: str, seconds: float) -> None:
        assert infer(server, model, request_id, seconds).status_code == 200
        answered[request_id] = time.monotonic()

    first = pool.submit(call, slow_id, 0.6)
    records.wait_started(slow_id)
    second = pool.submit(call, quick_id, 0.0)
    first.result(30)
    second.result(30)
    (quick,) = records.executions([quick_id])
    (slow,) = records.executions([slow_id])
    assert quick["end"] < slow["end"]  # the second request really did finish first
    # With preserve_ordering its answer waits for the first one; without, it does not.
    assert (answered[quick_id] > slow["end"]) is ordered


def test_gpu_instance_group_fails_to_load_with_a_clear_reason(server: TritiumProcess) -> None:
    url = f"http://{server.http_url}/v2/repository/index"
    index = requests.post(url, json={}, timeout=10).json()
    (entry,) = [e for e in index if e["name"] == "gpu_group"]
    assert entry["state"] == "UNAVAILABLE"
    assert "KIND_GPU requested but no GPU is available" in entry["reason"]
