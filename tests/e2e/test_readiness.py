"""Server readiness as a load balancer or kubelet sees it (HTTP /v2/health/ready, gRPC
ServerReady, grpc.health.v1) while models load, unload, fail and restart, in each control
mode, with --strict-readiness true (Triton's default) and false."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
import requests
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.e2e.observe import wait_until
from tests.server_process import TritiumProcess
from tests.zoo import _parameter, _tensor, add_model

pytestmark = pytest.mark.e2e

IO = _tensor("input", "INPUT0", "FP32", "1") + _tensor("output", "OUTPUT0", "FP32", "1")
STRICTNESS = pytest.mark.parametrize("strict", [True, False], ids=["strict", "not-strict"])


def http_ready(server: TritiumProcess) -> bool:
    return requests.get(f"http://{server.http_url}/v2/health/ready", timeout=30).ok


def ready(server: TritiumProcess) -> bool:
    """The server's readiness, asked three ways; the three must agree (ask only while
    nothing changes it)."""
    http = requests.get(f"http://{server.http_url}/v2/health/ready", timeout=30)
    assert http.status_code in (200, 400), http.text
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        grpc_ready = client.is_server_ready()
    finally:
        client.close()
    with grpc.insecure_channel(server.grpc_url) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                          timeout=30)
    serving = reply.status == health_pb2.HealthCheckResponse.SERVING
    assert (http.status_code == 200) is grpc_ready is serving
    return grpc_ready


def expect(server: TritiumProcess, strict: bool, strict_answer: bool) -> None:
    """Strict readiness answers ``strict_answer``; without it a running server is ready."""
    assert ready(server) is (strict_answer if strict else True), server.log()



def state(server: TritiumProcess, name: str) -> tuple[str, str]:
    reply = requests.post(f"http://{server.http_url}/v2/repository/index", json={}, timeout=30)
    for row in reply.json():
        if row["name"] == name:
            return row.get("state", ""), row.get("reason", "")
    return "", ""


def serve(repo: Path, strict: bool, *args: str) -> TritiumProcess:
    return TritiumProcess(repo, f"--strict-readiness={str(strict).lower()}", *args).start()


def gated(repo: Path, name: str, gate: Path, *, fail: bool = False,
          gate_finalize: bool = False) -> None:
    add_model(repo, name, "gated", IO + _parameter("gate", str(gate))
              + _parameter("fail", str(fail).lower())
              + _parameter("gate_finalize", str(gate_finalize).lower()))


@pytest.fixture()
def server_box() -> Iterator[list[TritiumProcess]]:
    box: list[TritiumProcess] = []
    yield box
    for server in box:
        assert server.stop() in (0, 1), server.log()


@STRICTNESS
def test_explicit_mode_load_unload_and_failure(tmp_path: Path, strict: bool,
                                               server_box: list[TritiumProcess]) -> None:
    repo, gate, bad = tmp_path / "repo", tmp_path / "gate", tmp_path / "bad"
    add_model(repo, "good", "identity", IO)
    gated(repo, "slow", gate, gate_finalize=True)
    gated(repo, "broken", bad, fail=True)
    (tmp_path / "bad.init").touch()
    server = serve(repo, strict, "--model-control-mode=explicit", "--load-model=good")
    server_box.append(server)
    expect(server, strict, True)  # models never asked for do not count

    base = f"http://{server.http_url}/v2/repository/models"
    with ThreadPoolExecutor(1) as pool:
        loading = pool.submit(requests.post, f"{base}/slow/load", timeout=60)
        wait_until(lambda: state(server, "slow")[0] == "LOADING", "slow loading", 60.0)
        expect(server, strict, False)  # a model loading is not ready yet (Triton #7014)
        (tmp_path / "gate.init").touch()
        assert loading.result().status_code == 200
    expect(server, strict, True)

    assert requests.post(f"{base}/slow/unload", timeout=60).status_code == 200
    assert state(server, "slow")[0] == "UNLOADING"  # its finalize waits on the gate
    expect(server, strict, False)
    (tmp_path / "gate.finalize").touch()
    wait_until(lambda: state(server, "slow") == ("UNAVAILABLE", "unloaded"), "slow unloaded",
               60.0)
    expect(server, strict, True)  # unloaded on purpose does not count (Triton #7588)

    assert requests.post(f"{base}/broken/load", timeout=60).status_code == 400
    expect(server, strict, False)  # a model that failed to load
    assert requests.post(f"{base}/broken/unload", timeout=60).status_code == 200
    expect(server, strict, True)


@STRICTNESS
def test_a_startup_failure_with_exit_on_error_false(tmp_path: Path, strict: bool,
                                                    server_box: list[TritiumProcess]) -> None:
    repo = tmp_path / "repo"
    add_model(repo, "good", "identity", IO)
    add_model(repo, "bad_init", "bad_init", IO)
    server = serve(repo, strict, "--exit-on-error=false")
    server_box.append(server)
    expect(server, strict, False)
    assert state(server, "good")[0] == "READY"


@STRICTNESS
def test_poll_mode_follows_the_repository(tmp_path: Path, strict: bool,
                                          server_box: list[TritiumProcess]) -> None:
    repo = tmp_path / "repo"
    add_model(repo, "good", "identity", IO)
    server = serve(repo, strict, "--model-control-mode=poll", "--repository-poll-secs=0.2")
    server_box.append(server)
    expect(server, strict, True)
    add_model(repo, "bad_init", "bad_init", IO)
    # found but not yet tried is listed UNAVAILABLE too, without a reason
    wait_until(lambda: (row := state(server, "bad_init"))[0] == "UNAVAILABLE" and row[1] != "",
               "bad_init failed", 60.0)
    expect(server, strict, False)
    shutil.rmtree(repo / "bad_init")
    # gone, and no longer held
    wait_until(lambda: state(server, "bad_init") == ("", ""), "bad_init gone", 60.0)
    expect(server, strict, True)


@STRICTNESS
def test_an_instance_process_that_dies_is_not_ready_until_restarted(
        tmp_path: Path, strict: bool, server_box: list[TritiumProcess]) -> None:
    repo = tmp_path / "repo"
    add_model(repo, "crash", "crash", IO + _parameter("TRITIUM_INSTANCE_KIND", "process"))
    server = serve(repo, strict)
    server_box.append(server)
    expect(server, strict, True)
    body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [3]}]}
    reply = requests.post(f"http://{server.http_url}/v2/models/crash/infer", json=body,
                          timeout=60)
    assert reply.status_code != 200
    # The death is known before its answer leaves; a new process takes a moment to start.
    expect(server, strict, False)
    wait_until(lambda: http_ready(server), "ready again", 60.0)
    expect(server, strict, True)


def test_a_load_refused_before_model_code_runs_leaves_readiness_alone(
        tmp_path: Path, server_box: list[TritiumProcess]) -> None:
    """An explicit load refused from the configs alone (an ensemble cycle, a step of an
    unknown model, a tensor nobody writes, a config that does not fit its steps) answers 400
    and changes nothing: the server stays ready under strict readiness."""
    from tests.e2e.ensemble_repos import BAD, build_validation_repository

    repo = build_validation_repository(tmp_path / "repo")
    server = serve(repo, True, "--model-control-mode=explicit", "--load-model=good")
    server_box.append(server)
    expect(server, True, True)
    base = f"http://{server.http_url}/v2/repository/models"
    refused = [name for name in BAD if name != "bad_dependency"]  # that one runs model code
    for name in refused:
        reply = requests.post(f"{base}/{name}/load", timeout=60)
        assert reply.status_code == 400, (name, reply.text)
        assert ready(server), (name, server.log())
