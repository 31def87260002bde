"""Instance processes that die: their requests fail at once, the instance restarts, the
server stays live, readiness tells the truth, logs and metrics say what happened; and no
process of a model outlives the server, even when the server is SIGKILLed."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.server_process import TritiumProcess
from tests.zoo import _parameter, _tensor, add_model

pytestmark = pytest.mark.e2e

IO = _tensor("input", "INPUT0", "FP32", "1") + _tensor("output", "OUTPUT0", "FP32", "1")
PROCESS = _parameter("TRITIUM_INSTANCE_KIND", "process")
# Triton's answer to the requests of a stub that died (python_backend stub_launcher.cc,
# ReceiveMessageFromStub: the stub's health flag was not set again, "is not healthy").
UNHEALTHY = "Stub process 'crash_0' is not healthy."


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("records")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, records: Path) -> Iterator[TritiumProcess]:
    repo = tmp_path_factory.mktemp("crash_repo")
    add_model(repo, "crash", "crash", IO + PROCESS)
    add_model(repo, "bystander", "crash", IO + PROCESS)
    add_model(repo, "never_polls", "never_polls",
              IO + PROCESS + _parameter("record_file", str(records / "never_polls.jsonl"))
              + _parameter("TRITIUM_KILL_AFTER_CANCEL_SECS", "1"))
    process = TritiumProcess(repo).start()
    yield process
    assert process.stop() == 0, process.log()


def infer(server: TritiumProcess, model: str, value: float, timeout: float = 60) -> Any:
    body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [value]}]}
    reply = requests.post(f"http://{server.http_url}/v2/models/{model}/infer", json=body,
                          timeout=timeout)
    return reply.status_code, reply.json()


def pid_of(server: TritiumProcess, model: str) -> int:
    status, body = infer(server, model, 0)
    assert status == 200, body
    return int(body["outputs"][0]["data"][0])


def ready(server: TritiumProcess, model: str) -> bool:
    reply = requests.get(f"http://{server.http_url}/v2/models/{model}/ready", timeout=30)
    return reply.status_code == 200


def wait_until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def restarts(server: TritiumProcess, model: str) -> float:
    text = requests.get(server.metrics_url, timeout=30).text
    for line in text.splitlines():
        if line.startswith("tritium_model_instance_restarts{") and f'model="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no restart counter for {model}:\n{text}")


@pytest.mark.parametrize(("mode", "cause"), [
    (1, "killed by signal SIGSEGV (11)"),
    (2, "exited with code 3"),
    (3, "killed by signal SIGKILL (9)"),
    (4, "killed by signal SIGABRT (6)"),  # std::bad_alloc past the model's RLIMIT_AS
], ids=["segfault", "os._exit", "sigkill", "rlimit_as"])
def test_a_dying_instance_fails_its_request_restarts_and_serves_again(
        server: TritiumProcess, mode: int, cause: str) -> None:
    before_pid, before_restarts = pid_of(server, "crash"), restarts(server, "crash")
    start = len(server.lines)
    status, body = infer(server, "crash", mode)
    assert status == 500 and UNHEALTHY in body["error"], body
    # The death is known before its answer leaves: not ready until a new process is up.
    assert not ready(server, "crash")
    assert requests.get(f"http://{server.http_url}/v2/health/live", timeout=30).ok
    assert ready(server, "bystander")
    line = server.wait_for_line(f"process {before_pid} of model 'crash'", 30, start)
    assert cause in line and "it will be restarted" in line
    wait_until(lambda: ready(server, "crash"))
    assert pid_of(server, "crash") != before_pid
    assert restarts(server, "crash") == before_restarts + 1
    assert not _alive(before_pid)


def test_an_ordinary_model_error_keeps_the_process(server: TritiumProcess) -> None:
    before = pid_of(server, "crash")
    status, body = infer(server, "crash", 5)
    assert status == 500 and "an ordinary error" in body["error"]
    assert pid_of(server, "crash") == before


def test_the_crash_error_reaches_grpc_clients_too(server: TritiumProcess) -> None:
    pid_of(server, "crash")  # a process is up
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        inputs = [grpcclient.InferInput("INPUT0", [1], "FP32")]
        inputs[0].set_data_from_numpy(np.array([2], dtype=np.float32))
        with pytest.raises(InferenceServerException) as caught:
            client.infer("crash", inputs)
        assert UNHEALTHY in caught.value.message()
        assert caught.value.status() == "StatusCode.INTERNAL"
        wait_until(lambda: client.is_model_ready("crash"))
    assert pid_of(server, "crash") > 0


def test_requests_queued_during_a_restart_are_served_after_it(server: TritiumProcess) -> None:
    """The slot stays busy while no process is up: what is queued behind the dying request
    waits for the new process instead of failing against the dead one."""
    pid_of(server, "crash")
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=60) as crasher:
        crasher.sendall(_raw_infer("crash", 3))
        time.sleep(0.05)  # only orders the two sends; the assertion does not depend on it
        status, body = infer(server, "crash", 0)
        assert status == 200, body
        assert b"not healthy" in crasher.recv(65536)


def test_a_cancelled_execute_that_never_polls_is_killed_after_its_grace(
        server: TritiumProcess, records: Path) -> None:
    """TRITIUM_KILL_AFTER_CANCEL_SECS=1: the client leaves a 60 s execute that never asks
    is_cancelled(); a second later the process is killed and restarted, and the slot
    serves again long before the 60 s would have passed."""
    record = records / "never_polls.jsonl"
    first = pid_of(server, "never_polls")
    begun = len(record.read_text().splitlines())
    start = len(server.lines)
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=60) as client:
        client.sendall(_raw_infer("never_polls", 60))
        wait_until(lambda: len(record.read_text().splitlines()) > begun)
    left = time.monotonic()
    line = server.wait_for_line("killed by tritium", 30, start)
    assert "TRITIUM_KILL_AFTER_CANCEL_SECS" in line and f"process {first}" in line
    wait_until(lambda: ready(server, "never_polls"))
    second = pid_of(server, "never_polls")
    assert second != first and not _alive(first)
    assert time.monotonic() - left < 30


def _raw_infer(model: str, value: float) -> bytes:
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32",
                                   "data": [value]}]}).encode()
    return (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode() + body


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# -- the server goes, its instance processes go ----------------------------------------
def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def test_no_instance_process_or_pool_worker_outlives_a_sigkilled_server(
        tmp_path: Path) -> None:
    """A model with a multiprocessing.Pool forks only its own process (the workers'
    parent is the instance process, not the server); SIGKILL the server and the guardian,
    the instance process and its workers are all gone (guardian.py)."""
    record = tmp_path / "pool.jsonl"
    add_model(tmp_path / "repo", "pool", "pool",
              _tensor("input", "INPUT0", "FP32", "3") + _tensor("output", "OUTPUT0", "FP32", "3")
              + PROCESS + _parameter("record_file", str(record)))
    server = TritiumProcess(tmp_path / "repo").start()
    try:
        body = {"inputs": [{"name": "INPUT0", "shape": [3], "datatype": "FP32",
                            "data": [1, 2, 3]}]}
        reply = requests.post(f"http://{server.http_url}/v2/models/pool/infer", json=body,
                              timeout=60)
        assert reply.json()["outputs"][0]["data"] == [1, 4, 9]
        seen = json.loads(record.read_text().splitlines()[-1])
        # The instance is the child of its guardian, the server's child...
        assert set(_children(server.pid)) == {seen["ppid"]}
        assert set(_children(seen["ppid"])) == {seen["pid"]}
        assert seen["worker_parents"] == [seen["pid"]]  # ...and the workers are its own
        doomed = [seen["ppid"], seen["pid"], *seen["workers"]]
        assert all(_alive(pid) for pid in doomed)
    finally:
        server.signal(signal.SIGKILL)
        server.wait(30)
    wait_until(lambda: not any(_alive(pid) for pid in doomed), timeout=30)


def test_unload_and_shutdown_stop_the_instance_processes(tmp_path: Path) -> None:
    add_model(tmp_path / "repo", "crash", "crash", IO + PROCESS)
    add_model(tmp_path / "repo", "other", "crash", IO + PROCESS)
    server = TritiumProcess(tmp_path / "repo", "--model-control-mode", "explicit",
                            "--load-model", "*").start()
    try:
        first, second = pid_of(server, "crash"), pid_of(server, "other")
        reply = requests.post(f"http://{server.http_url}/v2/repository/models/crash/unload",
                              timeout=60)
        assert reply.ok, reply.text
        wait_until(lambda: not _alive(first))
        assert _alive(second)
    finally:
        assert server.stop() == 0, server.log()
    assert not _alive(second)
    assert "it will be restarted" not in server.log()


def _held(pid: int) -> tuple[int, int]:
    """The server's open descriptors, and its mappings of the arenas it writes to its
    instances (those from an instance live on while a response tensor views them)."""
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    with open(f"/proc/{pid}/maps") as f:
        arenas = sum(1 for line in f if "memfd:tritium-" in line and "-in " in line)
    return fds, arenas


def _restarted(server: TritiumProcess, before: int) -> Callable[[], bool]:
    return lambda: ready(server, "crash") and pid_of(server, "crash") != before


def test_a_dead_instance_releases_its_descriptors_and_arenas_at_once(
        server: TritiumProcess) -> None:
    pid_of(server, "crash")
    fds, arenas = _held(server.pid)
    for _ in range(3):
        before = pid_of(server, "crash")
        infer(server, "crash", 2)
        wait_until(_restarted(server, before))
    after_fds, after_arenas = _held(server.pid)
    assert after_arenas <= arenas, (arenas, after_arenas)
    assert after_fds <= fds + 2, (fds, after_fds)  # a connection or two of this test


def test_a_model_whose_initialize_keeps_failing_is_given_up_with_its_reason(
        tmp_path: Path) -> None:
    add_model(tmp_path / "repo", "fragile", "init_fails_after_crash", IO + PROCESS)
    server = TritiumProcess(tmp_path / "repo").start()
    try:
        assert infer(server, "fragile", 0)[0] == 200
        infer(server, "fragile", 1)  # dies; every restart's initialize fails from now on

        def given_up() -> bool:
            reply = requests.post(f"http://{server.http_url}/v2/repository/index",
                                  json={}, timeout=30)
            (row,) = reply.json()
            return row.get("state") == "UNAVAILABLE"
        wait_until(given_up, timeout=60)
        (row,) = requests.post(f"http://{server.http_url}/v2/repository/index", json={},
                               timeout=30).json()
        assert "dependency is gone" in row["reason"] and "not restarted again" in row["reason"]
        status, body = infer(server, "fragile", 0)
        assert status != 200 and "dependency is gone" in body["error"], body
        assert requests.get(f"http://{server.http_url}/v2/health/live", timeout=30).ok
    finally:
        assert server.stop() == 0, server.log()
