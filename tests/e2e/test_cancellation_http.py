"""A client that leaves an HTTP request cancels it: queued or executing, every endpoint."""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.e2e.observe import Records, wait_for_metric
from tests.server_process import TritiumProcess

ENDPOINTS = ("infer", "generate", "generate_stream")
MODELS = ("slow", "slow_decoupled")


def body(endpoint: str, request_id: str, seconds: float) -> bytes:
    if endpoint == "infer":
        payload: dict[str, object] = {"id": request_id, "inputs": [
            {"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [seconds]}]}
    else:
        payload = {"id": request_id, "INPUT0": seconds}
    return json.dumps(payload).encode()


def raw_request(model: str, endpoint: str, request_id: str, seconds: float) -> bytes:
    data = body(endpoint, request_id, seconds)
    return (f"POST /v2/models/{model}/{endpoint} HTTP/1.1\r\nHost: t\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
            ).encode() + data


def connect(server: TritiumProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.http_port), timeout=30)


def leave(sock: socket.socket, reset: bool = False) -> None:
    if reset:  # RST instead of FIN
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def new_id() -> str:
    return uuid.uuid4().hex[:12]


@pytest.fixture(scope="module")
def records(record_dir: Path) -> Records:
    return Records(record_dir / "slow.jsonl")


@pytest.fixture()
def occupied(server: TritiumProcess, records: Records) -> Iterator[dict[str, str]]:
    """Keeps each slow model's single instance busy, so the next request must queue."""
    socks, ids = [], {}
    for model in MODELS:
        rid = new_id()
        sock = connect(server)
        sock.sendall(raw_request(model, "infer" if model == "slow" else "generate", rid, 30))
        records.wait_for(rid, "start")
        socks.append(sock)
        ids[model] = rid
    yield ids
    for sock in socks:
        leave(sock)
    for rid in ids.values():
        records.wait_for(rid, "cancelled")


def cells() -> list[tuple[str, str]]:
    return [(e, m) for e in ENDPOINTS for m in MODELS if not (e == "infer" and m != "slow")]


@pytest.mark.parametrize("reset", [False, True], ids=["fin", "rst"])
@pytest.mark.parametrize(("endpoint", "model"), cells())
def test_leaving_cancels_an_executing_request(server: TritiumProcess, records: Records,
                                              endpoint: str, model: str, reset: bool) -> None:
    rid = new_id()
    sock = connect(server)
    sock.sendall(raw_request(model, endpoint, rid, 30))
    records.wait_for(rid, "start")
    leave(sock, reset)
    records.wait_for(rid, "cancelled", timeout=2)
    server.wait_for_line(f"request {rid} for model '{model}' version 1 cancelled while executing")


@pytest.mark.parametrize(("endpoint", "model"), cells())
def test_leaving_removes_a_queued_request(server: TritiumProcess, records: Records,
                                          occupied: dict[str, str], endpoint: str,
                                          model: str) -> None:
    rid = new_id()
    sock = connect(server)
    sock.sendall(raw_request(model, endpoint, rid, 0.01))
    wait_for_metric(server.metrics_url, "nv_inference_pending_request_count", 1, model=model)
    leave(sock)
    server.wait_for_line(f"request {rid} for model '{model}' version 1 cancelled while queued")
    wait_for_metric(server.metrics_url, "nv_inference_pending_request_count", 0, model=model)
    assert records.events(rid) == []


@pytest.mark.parametrize(("model", "endpoint"), [("slow", "infer"),
                                               ("slow_decoupled", "generate_stream")])
def test_pipelined_request_behind_another_never_runs(server: TritiumProcess, records: Records,
                                                      model: str, endpoint: str) -> None:
    first, second = new_id(), new_id()
    sock = connect(server)
    sock.sendall(raw_request(model, endpoint, first, 30) + raw_request(model, endpoint, second, 0))
    records.wait_for(first, "start")
    leave(sock)
    records.wait_for(first, "cancelled", timeout=2)
    # The next request runs on the freed instance; a leaked pipelined one would run first.
    after = new_id()
    reply = requests.post(f"http://{server.http_url}/v2/models/{model}/generate_stream",
                          data=body("generate_stream", after, 0.01), timeout=30)
    assert reply.status_code == 200
    assert records.events(after) == ["start", "done"]
    assert records.events(second) == []


KILLABLE_CLIENT = ("import requests, sys; requests.post(sys.argv[1], data=sys.argv[2].encode(), "
                   "timeout=60)")


def killed_client(server: TritiumProcess, model: str, endpoint: str, request_id: str
                  ) -> subprocess.Popen[bytes]:
    url = f"http://{server.http_url}/v2/models/{model}/{endpoint}"
    data = body(endpoint, request_id, 30).decode()
    return subprocess.Popen([sys.executable, "-c", KILLABLE_CLIENT, url, data])


@pytest.mark.parametrize(("endpoint", "model"), cells())
def test_killed_client_process_cancels_executing(server: TritiumProcess, records: Records,
                                                 endpoint: str, model: str) -> None:
    rid = new_id()
    client = killed_client(server, model, endpoint, rid)
    try:
        records.wait_for(rid, "start")
    finally:
        client.kill()
        client.wait()
    records.wait_for(rid, "cancelled", timeout=2)


@pytest.mark.parametrize(("endpoint", "model"), cells())
def test_killed_client_process_removes_queued(server: TritiumProcess, records: Records,
                                              occupied: dict[str, str], endpoint: str,
                                              model: str) -> None:
    rid = new_id()
    client = killed_client(server, model, endpoint, rid)
    try:
        wait_for_metric(server.metrics_url, "nv_inference_pending_request_count", 1, model=model)
    finally:
        client.kill()
        client.wait()
    server.wait_for_line(f"request {rid} for model '{model}' version 1 cancelled while queued")
    assert records.events(rid) == []


def test_bls_child_is_cancelled_with_its_parent(server: TritiumProcess, record_dir: Path) -> None:
    children = Records(record_dir / "slow_child.jsonl")
    rid = new_id()
    data = json.dumps({"id": rid, "MODE": "slow", "INPUT0": [30.0]}).encode()
    sock = connect(server)
    sock.sendall((f"POST /v2/models/bls/generate HTTP/1.1\r\nHost: t\r\n"
                  f"Content-Length: {len(data)}\r\n\r\n").encode() + data)
    children.wait_for(rid, "start")
    leave(sock)
    children.wait_for(rid, "cancelled", timeout=2)
    server.wait_for_line(f"request {rid} for model 'slow_child' version 1 cancelled while "
                         "executing: parent request cancelled")


def test_request_finished_before_leaving_is_not_cancelled(server: TritiumProcess,
                                                          records: Records) -> None:
    rid = new_id()
    sock = connect(server)
    sock.sendall(raw_request("slow", "infer", rid, 0.01))
    reply = b""
    while b"OUTPUT0" not in reply:
        chunk = sock.recv(65536)
        assert chunk, reply
        reply += chunk
    assert reply.startswith(b"HTTP/1.1 200")
    leave(sock)
    marker = new_id()
    requests.post(f"http://{server.http_url}/v2/models/slow/infer",
                  data=body("infer", marker, 0), timeout=30)
    assert records.events(rid) == ["start", "done"]
    assert f"request {rid} " not in server.log()
