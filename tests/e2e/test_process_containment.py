"""Every process a model starts, however it starts it, ends with its instance process and
with the server, even when the server is SIGKILLed (the instance's PID namespace)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from pathlib import Path

import pytest
import requests

from tests.e2e.observe import wait_until
from tests.server_process import TritiumProcess
from tests.zoo import _parameter, _tensor, add_model

pytestmark = pytest.mark.e2e

IO = _tensor("input", "INPUT0", "FP32", "1") + _tensor("output", "OUTPUT0", "FP32", "1")
PROCESS = _parameter("TRITIUM_INSTANCE_KIND", "process")
# sleep x4 (Popen, Popen in a session, a setsid'd python, a double fork's orphan), two
# multiprocessing workers: at least six besides the namespace's init.
STARTED = 6


def _parents() -> dict[int, int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                for line in f:
                    if line.startswith("PPid:"):
                        parents[int(entry)] = int(line.split()[1])
                        break
        except OSError:
            continue
    return parents


def descendants(pid: int) -> set[int]:
    parents = _parents()
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "State:\tZ" not in f.read()
    except OSError:
        return False



def _start_children(server: TritiumProcess, model: str) -> tuple[int, set[int]]:
    body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [0]}]}
    reply = requests.post(f"http://{server.http_url}/v2/models/{model}/infer", json=body,
                          timeout=120)
    assert reply.status_code == 200, reply.text
    instance = int(reply.json()["outputs"][0]["data"][0])
    # The instance's guardian holds the whole tree, orphans included (the double fork's
    # comes back to it); the double fork's middle process and spawn's helpers come and go.
    guardian = _parents()[instance]
    wait_until(lambda: len(_living(descendants(guardian))) > STARTED, "every child started",
               60.0)
    return instance, _living(descendants(guardian)) | {guardian}


def _living(pids: set[int]) -> set[int]:
    return {pid for pid in pids if _alive(pid)}


def _repo(tmp_path: Path) -> Path:
    add_model(tmp_path / "repo", "spawner", "spawner", IO + PROCESS)
    return tmp_path / "repo"


def test_no_child_of_a_model_survives_a_sigkilled_server(tmp_path: Path) -> None:
    server = TritiumProcess(_repo(tmp_path)).start()
    try:
        instance, children = _start_children(server, "spawner")
    finally:
        server.signal(signal.SIGKILL)
        server.wait(30)
    wait_until(lambda: not any(_alive(pid) for pid in {instance, *children}),
               "the instance and its children gone", 30)


def test_no_child_of_a_model_survives_its_instance(tmp_path: Path) -> None:
    server = TritiumProcess(_repo(tmp_path)).start()
    try:
        instance, children = _start_children(server, "spawner")
        body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32",
                            "data": [1]}]}
        requests.post(f"http://{server.http_url}/v2/models/spawner/infer", json=body,
                      timeout=120)
        wait_until(lambda: not any(_alive(pid) for pid in {instance, *children}),
                   "the instance and its children gone", 30)
        assert server.proc is not None and server.proc.poll() is None  # unharmed
    finally:
        assert server.stop() == 0, server.log()


def test_a_fork_of_a_thread_instance_holds_no_listener(tmp_path: Path) -> None:
    """Model code on a thread of the server forks: the fork outlives the server, yet the
    ports are free at once for the next server."""
    add_model(tmp_path / "repo", "forker", "forker",
              IO + _parameter("TRITIUM_INSTANCE_KIND", "thread"))
    server = TritiumProcess(tmp_path / "repo").start()
    fork = 0
    try:
        body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32",
                            "data": [0]}]}
        reply = requests.post(f"http://{server.http_url}/v2/models/forker/infer", json=body,
                              timeout=120)
        fork = int(reply.json()["outputs"][0]["data"][0])
        assert _alive(fork)
        ports = [int(url.rsplit(":", 1)[1]) for url in (server.http_url, server.grpc_url)]
    finally:
        assert server.stop() == 0, server.log()
    try:
        for port in ports:
            with socket.socket() as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(("127.0.0.1", port))  # EADDRINUSE while a fork listens
                probe.listen()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(fork, signal.SIGKILL)


def test_bls_from_a_models_multiprocessing_workers(tmp_path: Path) -> None:
    """Triton's test_multiprocess: Pool(10) workers forked by execute() each run BLS."""
    repo = tmp_path / "repo"
    add_model(repo, "identity_fp32", "identity", IO + PROCESS)
    add_model(repo, "bls_multiprocess", "bls_multiprocess",
              IO + PROCESS + _parameter("target", "identity_fp32"))
    server = TritiumProcess(repo).start()
    try:
        body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32",
                            "data": [0]}]}
        for _ in range(2):
            reply = requests.post(f"http://{server.http_url}/v2/models/bls_multiprocess/infer",
                                  json=body, timeout=120)
            assert reply.status_code == 200, reply.text
            assert reply.json()["outputs"][0]["data"] == [10]
    finally:
        assert server.stop() == 0, server.log()
