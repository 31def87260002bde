"""SIGTERM / SIGINT on a real server: refuse new work at once, drain, cancel the rest, exit 0."""

from __future__ import annotations

import json
import queue
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.e2e.observe import Records
from tests.server_process import TritiumProcess
from tests.zoo import add_lifecycle_model

LONG = 60.0  # outlives any exit timeout used here


@pytest.fixture()
def record(tmp_path: Path) -> Path:
    return tmp_path / "records.jsonl"


def start_server(tmp_path: Path, record: Path, exit_timeout: float) -> TritiumProcess:
    repo = tmp_path / "repo"
    add_lifecycle_model(repo, "life", record, instances=4)
    add_lifecycle_model(repo, "life_stream", record, decoupled=True, instances=4)
    return TritiumProcess(repo, "--exit-timeout-secs", str(exit_timeout)).start()


@pytest.fixture()
def processes() -> Iterator[list[TritiumProcess]]:
    started: list[TritiumProcess] = []
    yield started
    for process in started:  # only if a test failed before its server exited
        if process.proc is not None and process.proc.poll() is None:
            process.proc.kill()
            process.wait(10)


# -- clients ---------------------------------------------------------------------------
def infer_body(request_id: str, seconds: float) -> dict[str, Any]:
    return {"id": request_id, "inputs": [
        {"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [seconds]}]}


def http_infer(server: TritiumProcess, request_id: str, seconds: float) -> requests.Response:
    return requests.post(f"http://{server.http_url}/v2/models/life/infer",
                         json=infer_body(request_id, seconds), timeout=90)


def http_stream(server: TritiumProcess, request_id: str, seconds: float) -> list[dict[str, Any]]:
    """Every SSE event of /generate_stream, decoded."""
    url = f"http://{server.http_url}/v2/models/life_stream/generate_stream"
    with requests.post(url, json={"id": request_id, "INPUT0": seconds}, stream=True,
                       timeout=90) as reply:
        assert reply.status_code == 200, reply.text
        return [json.loads(line[len(b"data: "):]) for line in reply.iter_lines()
                if line.startswith(b"data: ")]


def grpc_inputs(seconds: float) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([seconds], dtype=np.float32))
    return [tensor]


def grpc_infer(server: TritiumProcess, request_id: str, seconds: float) -> Any:
    """The result's OUTPUT0, or the InferenceServerException raised."""
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        try:
            result = client.infer("life", grpc_inputs(seconds), request_id=request_id)
        except InferenceServerException as exc:
            return exc
        return result.as_numpy("OUTPUT0")


def grpc_stream(server: TritiumProcess, request_id: str, seconds: float) -> list[Any]:
    """Every callback of one streamed request: OUTPUT0 arrays or errors, until FINAL."""
    got: queue.Queue[Any] = queue.Queue()

    def callback(result: Any, error: Any) -> None:
        got.put(error if error is not None else result)

    items: list[Any] = []
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback)
        client.async_stream_infer("life_stream", grpc_inputs(seconds), request_id=request_id,
                                  enable_empty_final_response=True)
        while True:
            item = got.get(timeout=90)
            if isinstance(item, InferenceServerException):
                items.append(item)
                break
            response = item.get_response()
            if response.parameters["triton_final_response"].bool_param:
                break
            items.append(item.as_numpy("OUTPUT0"))
        client.stop_stream()
    return items


class Background:
    """Runs client calls on threads and collects what each returned."""

    def __init__(self) -> None:
        self.results: dict[str, Any] = {}
        self.threads: list[threading.Thread] = []

    def run(self, key: str, call: Callable[[], Any]) -> None:
        def target() -> None:
            try:
                self.results[key] = call()
            except Exception as exc:
                self.results[key] = exc

        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        self.threads.append(thread)

    def join(self, timeout: float = 60.0) -> dict[str, Any]:
        for thread in self.threads:
            thread.join(timeout)
        return self.results


def start_all_kinds(server: TritiumProcess, records: Records, seconds: float) -> Background:
    """One request of each kind (HTTP and gRPC, unary and streaming), all executing."""
    calls = Background()
    calls.run("http", lambda: http_infer(server, "http", seconds))
    calls.run("grpc", lambda: grpc_infer(server, "grpc", seconds))
    calls.run("http_stream", lambda: http_stream(server, "http_stream", seconds))
    calls.run("grpc_stream", lambda: grpc_stream(server, "grpc_stream", seconds))
    for key in ("http", "grpc", "http_stream", "grpc_stream"):
        records.wait_for(key, "start", timeout=30)
    return calls


def idle_keepalive(server: TritiumProcess) -> socket.socket:
    """A connection that made one request and then sits idle, kept alive."""
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
    sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n")
    assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    return sock


def wait_not_ready(server: TritiumProcess, timeout: float = 2.0) -> int:
    deadline = time.monotonic() + timeout
    while True:
        status = requests.get(f"http://{server.http_url}/v2/health/ready", timeout=5).status_code
        if status != 200 or time.monotonic() > deadline:
            return status


def finalized(records: Records, model: str, instances: int) -> bool:
    return records.events(f"{model}/1/1").count("finalize") == instances


# -- tests ---------------------------------------------------------------------------------
def test_sigterm_drains_in_flight_requests_and_exits_zero(
        tmp_path: Path, record: Path, processes: list[TritiumProcess]) -> None:
    server = start_server(tmp_path, record, exit_timeout=30)
    processes.append(server)
    records = Records(record)
    idle = idle_keepalive(server)
    calls = start_all_kinds(server, records, seconds=2.0)

    signalled = time.monotonic()
    server.signal(signal.SIGTERM)
    assert wait_not_ready(server) in (400, 503)
    live = requests.get(f"http://{server.http_url}/v2/health/live", timeout=5)
    assert live.status_code == 200
    refused = http_infer(server, "late_http", 0.1)
    assert refused.status_code == 503
    assert "shutting down" in refused.json()["error"]
    late = grpc_infer(server, "late_grpc", 0.1)
    assert isinstance(late, InferenceServerException)
    assert late.status() == "StatusCode.UNAVAILABLE"
    # Refused unprocessed: the gRPC listener is closed (a proxy retries a refused connection
    # on another server; a call on a connection already open is refused with REFUSED_STREAM).
    assert "Connection refused" in late.message(), late.message()

    code = server.wait(30)
    elapsed = time.monotonic() - signalled
    results = calls.join()
    idle.close()
    assert code == 0, server.log()
    # Drained well before the 30 s timeout: the idle keep-alive connection held nothing up.
    assert elapsed < 15, elapsed
    assert results["http"].status_code == 200, results["http"].text
    assert results["http"].json()["outputs"][0]["data"] == [2.0, 1.0, 1.0]
    assert list(results["grpc"]) == [2.0, 1.0, 1.0]
    assert results["http_stream"][-1]["OUTPUT0"] == [2.0, 1.0, 1.0]
    assert len(results["http_stream"]) >= 10
    assert not any(isinstance(i, Exception) for i in results["grpc_stream"])
    assert list(results["grpc_stream"][-1]) == [2.0, 1.0, 1.0]
    for key in ("http", "grpc", "http_stream", "grpc_stream"):
        assert records.events(key) == ["start", "done"]
    assert records.events("late_http") == [] and records.events("late_grpc") == []
    assert finalized(records, "life", 4) and finalized(records, "life_stream", 4)
    assert "shutdown complete: 4 request(s) drained, 0 cancelled" in server.lines[-1]


def test_requests_outliving_the_exit_timeout_get_the_shutdown_error(
        tmp_path: Path, record: Path, processes: list[TritiumProcess]) -> None:
    timeout = 2.0
    server = start_server(tmp_path, record, exit_timeout=timeout)
    processes.append(server)
    records = Records(record)
    calls = start_all_kinds(server, records, seconds=LONG)

    signalled = time.monotonic()
    server.signal(signal.SIGINT)
    code = server.wait(30)
    elapsed = time.monotonic() - signalled
    results = calls.join()
    assert code == 0, server.log()
    assert timeout <= elapsed < timeout + 5, elapsed

    assert results["http"].status_code == 503
    assert "server shutting down" in results["http"].json()["error"]
    grpc_error = results["grpc"]
    assert isinstance(grpc_error, InferenceServerException), grpc_error
    assert "server shutting down" in grpc_error.message()
    assert "server shutting down" in results["http_stream"][-1]["error"]
    stream_error = results["grpc_stream"][-1]
    assert isinstance(stream_error, InferenceServerException), results["grpc_stream"]
    assert "server shutting down" in stream_error.message()
    for key in ("http", "grpc", "http_stream", "grpc_stream"):
        assert records.events(key)[:2] == ["start", "cancelled"]
    assert finalized(records, "life", 4) and finalized(records, "life_stream", 4)
    assert "shutdown complete: 0 request(s) drained, 4 cancelled" in server.lines[-1]


def test_a_second_signal_exits_at_once(
        tmp_path: Path, record: Path, processes: list[TritiumProcess]) -> None:
    server = start_server(tmp_path, record, exit_timeout=60)
    processes.append(server)
    records = Records(record)
    calls = Background()
    calls.run("http", lambda: http_infer(server, "http", LONG))
    records.wait_for("http", "start", timeout=30)

    server.signal(signal.SIGTERM)
    server.wait_for_line("shutting down: waiting up to")
    signalled = time.monotonic()
    server.signal(signal.SIGINT)
    code = server.wait(15)
    assert code != 0
    assert time.monotonic() - signalled < 5
    assert "second signal" in server.log()
    calls.join(10)
    assert isinstance(calls.results.get("http"), requests.ConnectionError)
