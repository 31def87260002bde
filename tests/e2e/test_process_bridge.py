"""What model code asks of the server besides execute, run the same under both instance
kinds: BLS (exec, async_exec, decoupled, from threads the model starts), a client's leaving
reaching a BLS child, custom metrics on /metrics, pb_utils.Logger lines in the server's log,
and the model loading API. Each test runs on a thread-kind and a process-kind server with
the same repository, so "behaves as the thread kind" is the same assertion passing twice."""

from __future__ import annotations

import json
import re
import socket
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.conftest import instance_kinds
from tests.e2e.leaving import http_raw_request
from tests.e2e.observe import Records
from tests.server_process import TritiumProcess
from tests.zoo import _parameter, _tensor, add_model

DECOUPLED = "model_transaction_policy { decoupled: true }\n"
PROTOCOLS = ("http", "grpc")
FP32_IO = _tensor("input", "INPUT0", "FP32", "-1") + _tensor("output", "OUTPUT0", "FP32", "-1")
LABELS = 'app="demo",zone="z1"'


def build(repo: Path, records: Path) -> None:
    add_model(repo, "identity_fp32", "identity", FP32_IO)
    add_model(repo, "identity_bytes", "identity",
              _tensor("input", "INPUT0", "BYTES", "-1")
              + _tensor("output", "OUTPUT0", "BYTES", "-1"))
    add_model(repo, "repeat", "repeat",
              DECOUPLED + _tensor("input", "INPUT0", "INT32", "1")
              + _tensor("input", "DELAY", "FP32", "1", " optional: true")
              + _tensor("output", "OUTPUT0", "INT32", "1"))
    add_model(repo, "raises", "raises",
              _tensor("input", "INPUT0", "FP32", "1") + _tensor("output", "OUTPUT0", "FP32", "1"))
    add_model(repo, "slow_child", "slow",
              _tensor("input", "INPUT0", "FP32", "1") + _tensor("output", "OUTPUT0", "FP32", "1")
              + _parameter("record_file", str(records / "slow_child.jsonl")))
    add_model(repo, "bls", "bls",
              _tensor("input", "MODE", "BYTES", "1") + FP32_IO
              + "instance_group [{ count: 2 kind: KIND_CPU }]\n")
    add_model(repo, "bls_async", "bls_async", FP32_IO)
    add_model(repo, "bridge_probe", "bridge_probe",
              _tensor("input", "MODE", "BYTES", "1") + _tensor("input", "INPUT0", "FP32", "-1")
              + _tensor("input", "TEXT", "BYTES", "-1", " optional: true")
              + _tensor("output", "OUTPUT0", "FP32", "-1") + _tensor("output", "PID", "INT64", "1")
              + _tensor("output", "TEXT_OUT", "BYTES", "-1"))
    add_model(repo, "custom_metrics", "custom_metrics",
              FP32_IO + "instance_group [{ count: 2 kind: KIND_CPU }]\n")
    add_model(repo, "model_control", "model_control",
              _tensor("input", "ACTION", "BYTES", "1") + _tensor("input", "NAME", "BYTES", "1")
              + _tensor("input", "VERSION", "BYTES", "1")
              + _tensor("output", "OUTPUT0", "BOOL", "1"))
    add_model(repo, "ctl_target", "identity", 'backend: "python"\n' + FP32_IO)
    add_model(repo, "bls_in_init", "bls_in_init", "")


@dataclass(frozen=True)
class Bridge:
    server: TritiumProcess
    kind: str
    records: Path


@pytest.fixture(scope="module", params=instance_kinds())
def bridged(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Bridge]:
    kind = request.param
    records = tmp_path_factory.mktemp(f"bridge_records_{kind}")
    repo = tmp_path_factory.mktemp(f"bridge_repo_{kind}")
    build(repo, records)
    process = TritiumProcess(repo, "--python-instance-kind", kind,
                             "--model-control-mode", "explicit", "--load-model", "*")
    process.start(timeout=180)
    yield Bridge(process, kind, records)
    assert process.stop() == 0, process.log()


@pytest.fixture
def bridge(bridged: Bridge) -> TritiumProcess:
    return bridged.server


def client_for(server: TritiumProcess, protocol: str) -> Any:
    if protocol == "http":
        return httpclient.InferenceServerClient(server.http_url)
    return grpcclient.InferenceServerClient(server.grpc_url)


def infer(server: TritiumProcess, protocol: str, model: str, values: dict[str, np.ndarray],
          request_id: str = "") -> Any:
    module: Any = httpclient if protocol == "http" else grpcclient
    inputs = []
    for name, data in values.items():
        datatype = "BYTES" if data.dtype == object else \
            {"float32": "FP32", "int32": "INT32"}[data.dtype.name]
        tensor = module.InferInput(name, list(data.shape), datatype)
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    client = client_for(server, protocol)
    try:
        return client.infer(model, inputs, request_id=request_id)
    finally:
        client.close()


def mode(name: str) -> np.ndarray:
    return np.array([name.encode()], dtype=object)


def fp32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


# -- BLS ---------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bls_exec_decoupled_and_async(bridge: TritiumProcess, protocol: str) -> None:
    """exec() answers with the child's output, exec(decoupled=True) iterates every response
    of a decoupled child (repeat: indices 0..3, summed), an error of the child comes back
    inside the response, and async_exec from ``async def execute`` awaits two children."""
    result = infer(bridge, protocol, "bls", {"MODE": mode("exec"), "INPUT0": fp32(3, 2, 1)})
    assert result.as_numpy("OUTPUT0").tolist() == [3, 2, 1]
    result = infer(bridge, protocol, "bls", {"MODE": mode("decoupled"), "INPUT0": fp32(4)})
    assert result.as_numpy("OUTPUT0").tolist() == [6.0]
    result = infer(bridge, protocol, "bls_async", {"INPUT0": fp32(1.5, -2)})
    assert result.as_numpy("OUTPUT0").tolist() == [3.0, -4.0]
    with pytest.raises(Exception, match="this model always fails"):
        infer(bridge, protocol, "bls", {"MODE": mode("error"), "INPUT0": fp32(1)})


def test_bls_tensors_large_and_bytes(bridge: TritiumProcess) -> None:
    """A 16 MiB child input and output (past the arenas' small-block ring) and BYTES
    elements of every shape (empty, NUL, non-UTF-8) arrive unchanged both ways."""
    big = np.arange(4 << 20, dtype=np.float32)
    result = infer(bridge, "grpc", "bls", {"MODE": mode("exec"), "INPUT0": big})
    assert np.array_equal(result.as_numpy("OUTPUT0"), big)
    text = np.array([b"", b"a\x00b", b"\xff\xfe", "é".encode(), b"x" * 70000], dtype=object)
    result = infer(bridge, "http", "bridge_probe",
                   {"MODE": mode("bytes"), "INPUT0": fp32(0), "TEXT": text})
    assert result.as_numpy("TEXT_OUT").tolist() == text.tolist()


@pytest.mark.parametrize("way", ["thread", "stream"])
def test_bls_from_a_thread_the_model_starts(bridged: Bridge, way: str) -> None:
    """A thread the model starts itself has no request to follow, yet its BLS calls
    (exec, and exec(decoupled=True) read to the end) run as the execute thread's do.
    Under the process kind, execute runs in a process other than the server's."""
    server = bridged.server
    result = infer(server, "http", "bridge_probe", {"MODE": mode(way), "INPUT0": fp32(3)})
    expected = [3.0] if way == "thread" else [0.0, 1.0, 2.0]
    assert result.as_numpy("OUTPUT0").tolist() == expected
    in_server = int(result.as_numpy("PID")[0]) == server.pid
    assert in_server is (bridged.kind == "thread")


def leave_http(server: TritiumProcess, request_id: str, records: Records) -> None:
    body = json.dumps({"id": request_id, "inputs": [
        {"name": "MODE", "shape": [1], "datatype": "BYTES", "data": ["slow"]},
        {"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [30.0]}]}).encode()
    with socket.create_connection(("127.0.0.1", server.http_port)) as sock:
        sock.sendall(http_raw_request("bls", "infer", body))
        records.wait_for(request_id, "start", timeout=30)
    # Closed: the client left while the BLS child was working.


def leave_grpc(server: TritiumProcess, request_id: str, records: Records) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        inputs = []
        for name, data, datatype in (("MODE", mode("slow"), "BYTES"),
                                     ("INPUT0", fp32(30.0), "FP32")):
            tensor = grpcclient.InferInput(name, [1], datatype)
            tensor.set_data_from_numpy(data)
            inputs.append(tensor)
        call = client.async_infer("bls", inputs, lambda result, error: None,
                                  request_id=request_id)
        records.wait_for(request_id, "start", timeout=30)
        call.cancel()
    finally:
        client.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_client_leaving_cancels_the_bls_child(bridged: Bridge, protocol: str) -> None:
    """The client of a BLS parent leaves (HTTP: closes its connection; gRPC: cancels the
    call) while the parent blocks in exec() on a 30 s child: the child, a request of its
    own, follows its parent's cancellation and sees is_cancelled() within seconds."""
    records = Records(bridged.records / "slow_child.jsonl")
    request_id = f"leave-{protocol}-{uuid.uuid4().hex[:8]}"
    (leave_http if protocol == "http" else leave_grpc)(bridged.server, request_id, records)
    started = records.times(request_id, "start")[0]
    cancelled = records.wait_for(request_id, "cancelled", timeout=15)
    assert cancelled - started < 15
    assert "done" not in records.events(request_id)


# -- custom metrics ----------------------------------------------------------------------


def test_custom_metrics_of_every_instance_reach_metrics(bridge: TritiumProcess) -> None:
    """custom_metrics has two instances (under the process kind, two processes), each
    creating the same families: whichever runs a request adds to the one series of the
    server's registry, which /metrics shows as Triton writes custom families."""
    with ThreadPoolExecutor(max_workers=3) as pool:
        list(pool.map(lambda _: infer(bridge, "http", "custom_metrics",
                                      {"INPUT0": fp32(0.5, 2.5, 7.0)}), range(6)))
    text = requests.get(bridge.metrics_url, timeout=10).text.splitlines()
    assert "# HELP custom_metrics_requests Requests executed" in text
    assert "# TYPE custom_metrics_input_value histogram" in text
    assert f"custom_metrics_requests{{{LABELS}}} 6" in text
    assert f"custom_metrics_last_sum{{{LABELS}}} 10" in text
    assert f'custom_metrics_input_value_bucket{{{LABELS},le="2.5"}} 12' in text
    assert f"custom_metrics_input_value_count{{{LABELS}}} 18" in text


# -- pb_utils.Logger -----------------------------------------------------------------------


def model_lines(server: TritiumProcess, value: str) -> list[str]:
    return [line for line in server.lines if f"tritium.model: probe {value} " in line]


def probe_log(server: TritiumProcess, value: float) -> None:
    infer(server, "http", "bridge_probe", {"MODE": mode("log"), "INPUT0": fp32(value)})
    server.wait_for_line(f"tritium.model: probe {value:g} error", timeout=15)


def settings(server: TritiumProcess, changes: dict[str, Any]) -> None:
    reply = requests.post(f"http://{server.http_url}/v2/logging", json=changes, timeout=10)
    assert reply.status_code == 200, reply.text


def test_logger_lines_reach_the_server_log(bridge: TritiumProcess) -> None:
    """pb_utils.Logger writes through the server's log (logger tritium.model) with its
    format and levels: INFO, WARNING, ERROR always; VERBOSE only with a verbose level
    set through the logging extension; log_info false hides the INFO lines."""
    try:
        probe_log(bridge, 7)
        probe_log(bridge, 7.5)  # whatever 7 logged is in the log before this
        line = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (\w+) tritium\.model: probe 7 (\w+)"
        seen = [re.fullmatch(line, text) for text in model_lines(bridge, "7")]
        assert [(m.group(1), m.group(2)) for m in seen if m] == [
            ("INFO", "log"), ("INFO", "info"), ("WARNING", "warn"), ("ERROR", "error")]
        settings(bridge, {"log_verbose_level": 1})
        probe_log(bridge, 8)
        bridge.wait_for_line("DEBUG tritium.model: probe 8 verbose", timeout=15)
        settings(bridge, {"log_verbose_level": 0, "log_info": False})
        probe_log(bridge, 9)
        probe_log(bridge, 9.5)
        assert [line.split(" ")[2] for line in model_lines(bridge, "9")] == ["WARNING", "ERROR"]
    finally:
        settings(bridge, {"log_verbose_level": 0, "log_info": True})


# -- the model loading API -----------------------------------------------------------------


def control(server: TritiumProcess, protocol: str, action: str, name: str,
            version: str = "") -> bool:
    values = {"ACTION": mode(action), "NAME": mode(name), "VERSION": mode(version)}
    return bool(infer(server, protocol, "model_control", values).as_numpy("OUTPUT0")[0])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_model_control_from_model_code(bridge: TritiumProcess, protocol: str) -> None:
    """pb_utils.unload_model / load_model / is_model_ready run the server's repository
    calls; a refusal reaches the model as TritonModelException with Triton's prefix."""
    assert control(bridge, protocol, "ready", "ctl_target") is True
    control(bridge, protocol, "unload", "ctl_target")
    with pytest.raises(Exception, match="Failed to check model readiness: Request for "
                                        "unknown model: 'ctl_target'"):
        control(bridge, protocol, "ready", "ctl_target")
    control(bridge, protocol, "load", "ctl_target")
    assert control(bridge, protocol, "ready", "ctl_target", "1") is True
    with pytest.raises(Exception, match="TritonModelException: Failed to load model: "):
        control(bridge, protocol, "load", "no_such_model")


def test_bls_in_initialize_fails_the_load(bridge: TritiumProcess) -> None:
    """Triton's stub: "BLS is only supported during the 'execute' function." A model that
    calls another from initialize() is not READY, and says why."""
    index = requests.post(f"http://{bridge.http_url}/v2/repository/index", json={},
                          timeout=10).json()
    [entry] = [entry for entry in index if entry["name"] == "bls_in_init"]
    assert entry["state"] == "UNAVAILABLE"
    assert "BLS is only supported during the 'execute' function." in entry["reason"]
