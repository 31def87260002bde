"""The command line: flags, startup report, and one-line failures."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.server_process import TritiumProcess
from tests.zoo import add_model


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tritium", *args], capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["serve", "--no-such-flag"], "unrecognized arguments"),
        (["serve", "--http-port", "70000"], "port must be between"),
        (["serve", "--model-control-mode", "sometimes"], "invalid choice"),
        (["serve", "--model-repository", "/definitely/not/here"], "is not a readable directory"),
        (["serve", "--http-max-input-size", "0"], "positive"),
        (["serve", "--cpu-cores", "zero"], "expected core numbers"),
        (["serve", "--cpu-cores", "4096"], "cannot run on cores"),
        (["serve", "--python-threads-core", "first"], "expected auto, none or a core number"),
        (["serve", "--python-threads-core", "4096"], "not one this process may run on"),
    ],
)
def test_bad_invocations_exit_non_zero_with_one_line(args: list[str], fragment: str) -> None:
    result = run_cli(*args)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(lines) == 1, result.stderr
    assert fragment in lines[0]


def test_startup_reports_models_and_endpoints(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    add_model(repo, "identity_fp32", "identity",
              'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [-1] }]\n'
              'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [-1] }]\n')
    add_model(repo, "bad_init", "bad_init",
              'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [1] }]\n'
              'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [1] }]\n')
    server = TritiumProcess(repo).start()
    try:
        log = server.log()
        assert "model 'identity_fp32' version 1: READY" in log
        assert "model 'bad_init' version 1: UNAVAILABLE (" in log
        assert "initialize refuses to start" in log
        for endpoint in ("HTTP", "gRPC", "metrics"):
            assert server.ports[endpoint] > 0, log
        reply = requests.get(f"http://{server.http_url}/v2/health/live", timeout=10)
        assert reply.status_code == 200
    finally:
        assert server.stop() == 0


def test_cpu_cores_pins_the_server(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    add_model(repo, "identity_fp32", "identity",
              'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [-1] }]\n'
              'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [-1] }]\n')
    server = TritiumProcess(repo, "--cpu-cores", "0").start()
    try:
        status = Path(f"/proc/{server.pid}/status").read_text()
        assert "Cpus_allowed_list:\t0\n" in status
        for task in Path(f"/proc/{server.pid}/task").iterdir():  # every thread, too
            assert "Cpus_allowed_list:\t0\n" in (task / "status").read_text()
        reply = requests.get(f"http://{server.http_url}/v2/health/live", timeout=10)
        assert reply.status_code == 200
    finally:
        assert server.stop() == 0


def allowed_cores(task: Path) -> str:
    status = (task / "status").read_text()
    return status.split("Cpus_allowed_list:\t", 1)[1].split("\n", 1)[0]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to place threads")
def test_python_threads_share_a_core_and_model_code_runs_anywhere(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    add_model(repo, "affinity", "affinity",
              'output [{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [3] }]\n')
    server = TritiumProcess(repo, "--python-threads-core", "1").start()
    try:
        assert "event loop and idle instance threads on core 1" in server.log()
        main = Path(f"/proc/{server.pid}/task/{server.pid}")
        assert allowed_cores(main) == "1"
        # The loop, the idle instance thread and the metrics thread (libraries may start
        # a few threads of their own before placement).
        placed = [task for task in Path(f"/proc/{server.pid}/task").iterdir()
                  if allowed_cores(task) == "1"]
        assert len(placed) >= 3, [allowed_cores(task) for task in placed]
        reply = requests.post(f"http://{server.http_url}/v2/models/affinity/infer",
                              json={"inputs": []}, timeout=10)
        assert reply.status_code == 200, reply.text
        everywhere = len(os.sched_getaffinity(0))
        assert reply.json()["outputs"][0]["data"] == [everywhere] * 3
    finally:
        assert server.stop() == 0


def test_thread_placement_can_be_turned_off(tmp_path: Path) -> None:
    server = TritiumProcess(tmp_path, "--python-threads-core", "none").start()
    try:
        assert "threads are not placed" in server.log()
        main = Path(f"/proc/{server.pid}/task/{server.pid}")
        assert allowed_cores(main) == allowed_cores(Path("/proc/self"))
    finally:
        assert server.stop() == 0


def test_a_taken_port_is_a_one_line_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        result = run_cli("serve", "--model-repository", str(tmp_path), "--http-address",
                         "127.0.0.1", "--http-port", port, "--grpc-port", "0",
                         "--metrics-port", "0")
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and "address already in use" in errors[0], result.stderr
    assert "Traceback" not in result.stderr


def test_default_repository_is_the_bundled_example() -> None:
    server = TritiumProcess(Path("unused"))
    server.args = [a for a in server.args if a not in ("--model-repository", "unused")]
    server.start()
    try:
        for model in ("identity", "add_sub", "llm", "token_engine"):
            assert f"model '{model}' version 1: READY" in server.log()
    finally:
        assert server.stop() == 0
