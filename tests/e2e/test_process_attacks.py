"""Model code attacking the server through its instance channel: a pickle, a bad arena
offset, an oversized frame, a flood. Each ends (and restarts) that instance only, with
the reason logged; the server stays up and its other models keep serving. A malformed
call payload fails that call only."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.server_process import TritiumProcess
from tests.zoo import _parameter, _tensor, add_model

pytestmark = pytest.mark.e2e

IO = _tensor("input", "INPUT0", "FP32", "1") + _tensor("output", "OUTPUT0", "FP32", "1")
PROCESS = _parameter("TRITIUM_INSTANCE_KIND", "process")
PICKLE_MARK = "/tmp/tritium-hostile-pickle-ran"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritiumProcess]:
    repo = tmp_path_factory.mktemp("hostile_repo")
    add_model(repo, "hostile", "hostile", IO + PROCESS)
    add_model(repo, "bystander", "hostile", IO + PROCESS)
    process = TritiumProcess(repo, env={"TRITIUM_PROCESS_FLOOD_SECS": "2"}).start()
    yield process
    assert process.stop() == 0, process.log()


def infer(server: TritiumProcess, model: str, mode: int) -> tuple[int, Any]:
    body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [mode]}]}
    reply = requests.post(f"http://{server.http_url}/v2/models/{model}/infer", json=body,
                          timeout=120)
    return reply.status_code, reply.json()


def wait_serving(server: TritiumProcess, model: str, not_pid: int) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status, body = infer(server, model, 0)
        if status == 200 and int(body["outputs"][0]["data"][0]) != not_pid:
            return int(body["outputs"][0]["data"][0])
        time.sleep(0.1)
    raise AssertionError(f"{model} did not come back")


@pytest.mark.parametrize(("mode", "reason"), [
    (1, "is ended: "),
    (2, "lies outside the arena"),
    (3, "over the limit"),
], ids=["pickle", "bad_offset", "oversized"])
def test_a_bad_frame_ends_that_instance_only(server: TritiumProcess, mode: int,
                                             reason: str) -> None:
    if os.path.exists(PICKLE_MARK):
        os.unlink(PICKLE_MARK)
    before = wait_serving(server, "hostile", -1)
    start = len(server.lines)
    status, body = infer(server, "hostile", mode)
    assert status == 500, body
    line = server.wait_for_line("is ended: ", 30, start)
    assert reason in line and "'hostile'" in line
    assert infer(server, "bystander", 0)[0] == 200
    assert requests.get(f"http://{server.http_url}/v2/health/live", timeout=30).ok
    assert wait_serving(server, "hostile", before) != before  # restarted
    assert not os.path.exists(PICKLE_MARK)


@pytest.mark.parametrize(("mode", "reason"), [
    (5, "Expected `int | null`, got `str` - at `$[1]`"),
    (6, "Expected `array` of at least length 10, got 1"),
    (7, "Expected `int`, got `str` - at `$[3][0][2][0]`"),
    (8, "arrived with 16 bytes"),
], ids=["wrong_type", "missing_fields", "bad_shape", "shape_over_buffer"])
def test_a_malformed_bls_call_is_answered_with_an_error(server: TritiumProcess, mode: int,
                                                          reason: str) -> None:
    """A call is not a frame: the instance keeps serving, only that call fails."""
    before = wait_serving(server, "hostile", -1)
    start = len(server.lines)
    status, body = infer(server, "hostile", mode)
    assert status == 500 and reason in body["error"], body
    assert wait_serving(server, "hostile", -1) == before  # the same process serves on
    assert not any("is ended: " in line for line in server.lines[start:])


def test_a_flood_ends_that_instance_and_costs_the_others_little(
        server: TritiumProcess) -> None:
    before = wait_serving(server, "hostile", -1)
    start = len(server.lines)
    quiet = _latencies(server, 20)
    assert infer(server, "hostile", 4)[0] == 200  # the flood starts, from a thread
    flooded = _latencies(server, 20)
    line = server.wait_for_line("is ended: ", 60, start)
    assert "flood" in line and "'hostile'" in line
    # Generous: the flood is handled a bounded number of frames per loop turn.
    assert statistics.median(flooded) < statistics.median(quiet) + 0.25, (quiet, flooded)
    assert wait_serving(server, "hostile", before) != before


def _latencies(server: TritiumProcess, count: int) -> list[float]:
    times = []
    for _ in range(count):
        started = time.monotonic()
        assert infer(server, "bystander", 0)[0] == 200
        times.append(time.monotonic() - started)
    return times
