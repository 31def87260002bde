"""Behind nginx and HAProxy (the configurations in deploy/), a client that leaves still
cancels its request on the replica that runs it: HTTP /infer, /generate, /generate_stream, the
OpenAI stream, and gRPC unary and stream calls. And with the setting the README warns about
turned the wrong way, the replica's model works on for nobody."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.leaving import STOP_BOUND_S, cancel_line, http_raw_request, new_id
from tests.e2e.leaving_http import body, close
from tests.e2e.observe import Records
from tests.e2e.proxies import HAProxy, Nginx, Proxy, binary, build_replica_repository
from tests.server_process import TritiumProcess

# Long enough that only a cancel ends the work; a wrong setting's test waits for it instead.
WORK_S = 30.0
WASTED_S = 1.5
HTTP_CELLS = [("infer", "slow"), ("generate", "slow"), ("generate_stream", "slow"),
              ("generate_stream", "slow_decoupled")]
PACKAGES = {"nginx": "nginx", "haproxy": "haproxy"}


def require(name: str) -> None:
    if binary(name) is None:
        pytest.skip(f"{name} is not installed (apt-get install {PACKAGES[name]})")


@pytest.fixture(scope="module")
def record_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("proxy_records")


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory, record_dir: Path
             ) -> Iterator[list[TritiumProcess]]:
    repo = build_replica_repository(tmp_path_factory.mktemp("proxy_repo"), record_dir)
    started: list[TritiumProcess] = []
    try:
        for _ in range(2):
            started.append(TritiumProcess(repo).start())
        yield started
    finally:
        codes = [replica.stop() for replica in started]
        assert codes == [0] * len(started), [replica.log() for replica in started]


@contextmanager
def running(make: Callable[[], Proxy]) -> Iterator[Proxy]:
    proxy = make().start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture(scope="module", params=["nginx", "haproxy"])
def proxy(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
          replicas: list[TritiumProcess]) -> Iterator[Proxy]:
    require(request.param)
    kind = Nginx if request.param == "nginx" else HAProxy
    with running(lambda: kind(tmp_path_factory.mktemp(request.param), replicas)) as started:
        yield started


def edited(old: str, new: str) -> Callable[[str], str]:
    """A configuration edit that fails loudly once the shipped file no longer says ``old``."""
    def edit(config: str) -> str:
        assert config.count(old) == 1, f"the shipped configuration lost {old!r}"
        return config.replace(old, new)
    return edit


def wait_cancel_logged(replicas: list[TritiumProcess], request_id: str, model: str) -> None:
    """One replica, whichever the proxy chose, logged the request cancelled while executing."""
    line = cancel_line(request_id, model, "executing")
    deadline = time.monotonic() + 10
    while not any(line in replica.log() for replica in replicas):
        assert time.monotonic() < deadline, [replica.log() for replica in replicas]
        time.sleep(0.01)


def assert_cancelled(records: Records, replicas: list[TritiumProcess], request_id: str,
                     model: str, left_at: float) -> None:
    stopped = records.wait_for(request_id, "cancelled")
    assert stopped - left_at < STOP_BOUND_S, f"model stopped {stopped - left_at:.3f} s late"
    assert "done" not in records.events(request_id)
    wait_cancel_logged(replicas, request_id, model)


def send_http(proxy: Proxy, route: str, model: str, request_id: str, seconds: float
              ) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.http_port), timeout=30)
    sock.sendall(http_raw_request(model, route, body(route, request_id, {"INPUT0": seconds})))
    return sock


@pytest.mark.parametrize("reset", [False, True], ids=["fin", "rst"])
@pytest.mark.parametrize(("route", "model"), HTTP_CELLS)
def test_http_client_leaving_cancels_on_the_replica(
        proxy: Proxy, replicas: list[TritiumProcess], record_dir: Path, route: str, model: str,
        reset: bool) -> None:
    records, rid = Records(record_dir / "slow.jsonl"), new_id()
    sock = send_http(proxy, route, model, rid, WORK_S)
    records.wait_for(rid, "start")
    left_at = time.monotonic()
    close(sock, reset)
    assert_cancelled(records, replicas, rid, model, left_at)


def test_openai_stream_client_leaving_cancels_on_the_replica(
        proxy: Proxy, replicas: list[TritiumProcess], record_dir: Path) -> None:
    records, rid = Records(record_dir / "text.jsonl"), new_id()
    data = json.dumps({"model": "text_stream", "prompt": "a b c", "max_tokens": 1500,
                       "stream": True}).encode()
    sock = socket.create_connection(("127.0.0.1", proxy.http_port), timeout=30)
    sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json"
                 f"\r\nX-Request-Id: {rid}\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    received = b""
    while b'"text":"a ' not in received:  # the first word went through the proxy unbuffered
        chunk = sock.recv(65536)
        assert chunk, received
        received += chunk
    left_at = time.monotonic()
    close(sock)
    assert_cancelled(records, replicas, rid, "text_stream", left_at)


def infer_input(seconds: float) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([seconds], dtype=np.float32))
    return [tensor]


def test_grpc_unary_cancel_cancels_on_the_replica(
        proxy: Proxy, replicas: list[TritiumProcess], record_dir: Path) -> None:
    records, rid = Records(record_dir / "slow.jsonl"), new_id()
    outcomes: list[Any] = []
    with grpcclient.InferenceServerClient(proxy.grpc_url) as client:
        call = client.async_infer("slow", infer_input(WORK_S),
                                  lambda **outcome: outcomes.append(outcome), request_id=rid)
        records.wait_for(rid, "start")
        left_at = time.monotonic()
        call.cancel()
        assert_cancelled(records, replicas, rid, "slow", left_at)
    assert all(outcome["result"] is None for outcome in outcomes)


def test_grpc_stream_cancel_cancels_on_the_replica(
        proxy: Proxy, replicas: list[TritiumProcess], record_dir: Path) -> None:
    records, rid = Records(record_dir / "slow.jsonl"), new_id()
    with grpcclient.InferenceServerClient(proxy.grpc_url) as client:
        client.start_stream(lambda result, error: None)
        client.async_stream_infer("slow_decoupled", infer_input(WORK_S), request_id=rid)
        records.wait_for(rid, "start")
        left_at = time.monotonic()
        client.stop_stream(cancel_requests=True)
        assert_cancelled(records, replicas, rid, "slow_decoupled", left_at)


@pytest.mark.parametrize(("name", "old", "new"), [
    ("nginx", "proxy_ignore_client_abort off;", "proxy_ignore_client_abort on;"),
    ("haproxy", "    option abortonclose\n", ""),
], ids=["nginx-proxy_ignore_client_abort-on", "haproxy-without-abortonclose"])
def test_a_wrong_setting_lets_the_model_work_for_nobody(
        tmp_path: Path, replicas: list[TritiumProcess], record_dir: Path, name: str, old: str,
        new: str) -> None:
    """The README's warning, kept true: the client leaves, the replica never hears of it."""
    require(name)
    kind = Nginx if name == "nginx" else HAProxy
    records, rid = Records(record_dir / "slow.jsonl"), new_id()
    with running(lambda: kind(tmp_path / name, replicas, edit=edited(old, new))) as wrong:
        sock = send_http(wrong, "infer", "slow", rid, WASTED_S)
        records.wait_for(rid, "start")
        close(sock)
        records.wait_for(rid, "done", timeout=WASTED_S + 10)
    assert records.events(rid) == ["start", "done"]
