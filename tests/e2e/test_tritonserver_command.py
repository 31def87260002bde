"""The ``tritonserver`` command: deployments' command lines start the same server, with
tritonserver's defaults (exit on a startup load failure), its --id, and its log flags."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.e2e.test_grpc_limits import headers
from tests.e2e.test_grpc_raw import SERVICE, RawClient, goaway_code, grpc_port
from tests.server_process import TritiumProcess
from tests.zoo import _parameter, _tensor, add_model
from tritium.frontends.grpc.http2 import FrameType, H2Error

pytestmark = pytest.mark.e2e

IO = _tensor("input", "INPUT0", "FP32", "1") + _tensor("output", "OUTPUT0", "FP32", "1")
# The console script's entry point, run as the script would run it.
ENTRY = "import sys; from tritium.cli import tritonserver_main; sys.exit(tritonserver_main())"
LOOPBACK = ["--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
            "--metrics-address=127.0.0.1", "--metrics-port=0"]


def tritonserver(repo: Path, *args: str) -> TritiumProcess:
    """A TritiumProcess that runs ``tritonserver`` with ``args`` (ports 0: free ones)."""
    process = TritiumProcess(repo)
    process.args = [sys.executable, "-c", ENTRY, *LOOPBACK, *args]
    return process


def repository(tmp_path: Path, broken: bool = False) -> Path:
    repo = tmp_path / "models"
    add_model(repo, "identity_fp32", "identity", IO)
    if broken:
        add_model(repo, "bad_init", "bad_init", IO)
    return repo


def test_kserve_modelmesh_and_helm_command_lines(tmp_path: Path) -> None:
    repo = repository(tmp_path)
    server = tritonserver(
        repo, f"--model-store={repo}", "--grpc-port=0", "--http-port=0", "--allow-grpc=true",
        "--allow-http=true", "--model-control-mode=explicit", "--strict-readiness=false",
        "--strict-model-config=false", "--log-verbose=1", "--load-model=identity_fp32",
        "--id=replica-7").start()
    try:
        base = f"http://{server.http_url}"
        assert requests.get(f"{base}/v2/health/ready", timeout=30).status_code == 200
        assert requests.get(f"{base}/v2", timeout=30).json()["name"] == "replica-7"
        body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [2]}]}
        reply = requests.post(f"{base}/v2/models/identity_fp32/infer", json=body, timeout=30)
        assert reply.json()["outputs"][0]["data"] == [2.0]
        warnings = [line for line in server.lines if "WARNING" in line]
        assert len(warnings) == 1 and "--strict-model-config" in warnings[0], warnings
    finally:
        assert server.stop() == 0, server.log()


def test_a_startup_load_failure_exits_unless_exit_on_error_is_false(tmp_path: Path) -> None:
    repo = repository(tmp_path, broken=True)
    argv = [sys.executable, "-c", ENTRY, *LOOPBACK, f"--model-repository={repo}",
            "--http-port=0", "--grpc-port=0"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert "failed to load all models (bad_init)" in result.stderr
    assert "endpoint listening" not in result.stderr  # it never served
    server = tritonserver(repo, f"--model-repository={repo}", "--http-port=0",
                          "--grpc-port=0", "--exit-on-error=false").start()
    try:
        ready = requests.get(f"http://{server.http_url}/v2/health/ready", timeout=30)
        assert ready.status_code == 400  # strict readiness: a model failed
    finally:
        assert server.stop() == 0, server.log()


def test_json_log_lines_in_a_log_file(tmp_path: Path) -> None:
    repo, log_file = repository(tmp_path), tmp_path / "server.log"
    server = TritiumProcess(repo, "--log-format=json", f"--log-file={log_file}",
                            "--log-info=true", "--http-thread-count=4")
    # The log goes to the file, so the process's own reader never sees it: start it and
    # wait on the file instead.
    server.proc = subprocess.Popen(server.args, stderr=subprocess.PIPE,
                                   stdout=subprocess.DEVNULL, text=True)
    try:
        records = [json.loads(line) for line in _wait_for_line(log_file, "server ready")]
        assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
        assert any(r["level"] == "WARNING" and "--http-thread-count" in r["message"]
                   for r in records)
        assert records[0]["time"].endswith("Z")
    finally:
        assert server.stop() == 0


def _wait_for_line(path: Path, text: str, timeout: float = 60.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = path.read_text().splitlines() if path.exists() else []
        if any(text in line for line in lines):
            return lines
        time.sleep(0.05)
    raise AssertionError(f"no '{text}' in {path}")


def test_python_backend_config_names_and_sizes_the_process_arenas(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    add_model(repo, "in_process", "identity",
              IO + _parameter("TRITIUM_INSTANCE_KIND", "process"))
    server = tritonserver(repo, f"--model-repository={repo}", "--http-port=0", "--grpc-port=0",
                          "--backend-config=python,shm-region-prefix-name=rank3_",
                          "--backend-config=python,shm-default-byte-size=2097152").start()
    try:
        maps = Path(f"/proc/{server.pid}/maps").read_text()
        assert "/memfd:rank3_in_process_0-in" in maps
        assert "/memfd:tritium-" not in maps
        body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [5]}]}
        reply = requests.post(f"http://{server.http_url}/v2/models/in_process/infer",
                              json=body, timeout=30)
        assert reply.json()["outputs"][0]["data"] == [5.0]
    finally:
        assert server.stop() == 0, server.log()


def test_grpc_connections_leave_at_their_maximum_age(tmp_path: Path) -> None:
    repo = repository(tmp_path)
    server = tritonserver(repo, f"--model-repository={repo}", "--http-port=0", "--grpc-port=0",
                          "--grpc-max-connection-age=1000",
                          "--grpc-max-connection-age-grace=1000").start()
    try:
        with contextlib.closing(RawClient(grpc_port(server))) as raw:
            opened = time.monotonic()
            raw.send(headers(raw, 1, SERVICE + "/ModelStreamInfer"))  # a call left open
            assert goaway_code(raw.until(FrameType.GOAWAY)) == H2Error.NO_ERROR
            aged = time.monotonic() - opened
            ended = raw.remaining()  # the open call is ended after the grace, then closed
            closed = time.monotonic() - opened
        assert 0.8 < aged < 5.0  # not idle (that takes 300 s): old
        assert closed - aged > 0.5
        assert any(found.stream_id == 1 for found in ended)
    finally:
        assert server.stop() == 0, server.log()
