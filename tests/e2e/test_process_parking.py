"""An instance process that takes short batches one at a time waits on the server loop's
core, and leaves it for a long batch or once the model starts a thread (parking.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import requests

from tests.server_process import TritiumProcess
from tests.zoo import add_model

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                                reason="needs two cores to place the loop")

CONFIG = ('backend: "python"\n'
          'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [2] }]\n'
          'output [{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [2] }]\n')
EVERY_CORE = os.sched_getaffinity(0)
HOME = {1}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritiumProcess]:
    repo = tmp_path_factory.mktemp("parking") / "repo"
    add_model(repo, "park_probe", "park_probe", CONFIG)
    add_model(repo, "park_stream", "park_probe", CONFIG
              + "model_transaction_policy { decoupled: true }\n")
    server = TritiumProcess(repo, "--python-instance-kind", "process",
                            "--python-threads-core", "1").start()
    yield server
    server.stop()


def allowed(pid: int) -> set[int]:
    return os.sched_getaffinity(pid)


def infer(server: TritiumProcess, model: str, seconds: float, start_thread: bool = False
          ) -> tuple[int, int]:
    """The cores the model's execute may run on, and its process."""
    reply = requests.post(
        f"http://{server.http_url}/v2/models/{model}/infer",
        json={"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32",
                          "data": [seconds, float(start_thread)]}]}, timeout=30)
    assert reply.status_code == 200, reply.text
    cores, pid = reply.json()["outputs"][0]["data"]
    return cores, pid


def parked(server: TritiumProcess, model: str) -> int:
    """Short requests one at a time until the instance process waits on the loop's core (a
    batch preempted on a loaded machine may take long enough not to park it); its pid."""
    for _ in range(50):
        _, pid = infer(server, model, 0)
        if allowed(pid) == HOME:
            return pid
    raise AssertionError(f"{model}'s instance process never parked: {allowed(pid)}")


def test_short_batches_one_at_a_time_wait_on_the_loops_core(server: TritiumProcess) -> None:
    pid = parked(server, "park_probe")
    assert infer(server, "park_probe", 0.02)[0] == 1  # execute began parked
    # A long batch moves it back to every core at once, for the next one too.
    assert allowed(pid) == EVERY_CORE
    assert infer(server, "park_probe", 0)[0] == len(EVERY_CORE)
    assert parked(server, "park_probe") == pid


def test_a_thread_started_while_parked_moves_every_thread_back_for_good(
        server: TritiumProcess) -> None:
    pid = parked(server, "park_probe")
    infer(server, "park_probe", 0, start_thread=True)
    tasks = [int(task) for task in os.listdir(f"/proc/{pid}/task")]
    assert len(tasks) >= 2 and all(allowed(task) == EVERY_CORE for task in tasks)
    for _ in range(5):
        assert infer(server, "park_probe", 0)[0] == len(EVERY_CORE)
    assert allowed(pid) == EVERY_CORE


def test_a_decoupled_model_never_parks(server: TritiumProcess) -> None:
    for _ in range(4):
        reply = requests.post(f"http://{server.http_url}/v2/models/park_stream/generate",
                              json={"INPUT0": [0, 0]}, timeout=30)
        assert reply.status_code == 200, reply.text
        cores, pid = reply.json()["OUTPUT0"]
    assert cores == len(os.sched_getaffinity(0)) and allowed(pid) == EVERY_CORE
