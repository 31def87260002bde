"""SIGTERM's lame duck on a real server: not ready at once, yet every request still served,
keep-alive clients told to reconnect; then the usual drain. SIGINT skips it."""

from __future__ import annotations

import json
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import tritonclient.grpc as grpcclient

from tests.e2e.observe import Records
from tests.e2e.test_shutdown import (
    Background,
    grpc_infer,
    http_infer,
    idle_keepalive,
    infer_body,
)
from tests.server_process import TritiumProcess
from tests.zoo import add_lifecycle_model

LAME_DUCK_S = 4.0


@pytest.fixture()
def lame_duck_server(tmp_path: Path) -> Iterator[tuple[TritiumProcess, Records]]:
    record = tmp_path / "records.jsonl"
    add_lifecycle_model(tmp_path / "repo", "life", record, instances=2)
    server = TritiumProcess(tmp_path / "repo", "--lame-duck-secs", str(LAME_DUCK_S),
                            "--exit-timeout-secs", "30").start()
    yield server, Records(record)
    if server.proc is not None and server.proc.poll() is None:
        server.proc.kill()
        server.wait(10)


def ready_status(server: TritiumProcess) -> int:
    return requests.get(f"http://{server.http_url}/v2/health/ready", timeout=5).status_code


def infer_on(sock: socket.socket, request_id: str) -> bytes:
    """One /infer on an open keep-alive connection; the whole response."""
    body = json.dumps(infer_body(request_id, 0.0)).encode()
    sock.sendall(b"POST /v2/models/life/infer HTTP/1.1\r\nHost: t\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                 % (len(body), body))
    reply = b""
    while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        reply += chunk
    return reply


def test_sigterm_reports_not_ready_but_keeps_serving_then_drains(
        lame_duck_server: tuple[TritiumProcess, Records]) -> None:
    server, records = lame_duck_server
    idle = idle_keepalive(server)
    busy = Background()
    busy.run("long", lambda: http_infer(server, "long", LAME_DUCK_S + 1.0))
    records.wait_for("long", "start", timeout=30)

    signalled = time.monotonic()
    server.signal(signal.SIGTERM)
    server.wait_for_line("lame duck: reporting not ready", timeout=10)
    assert ready_status(server) == 400
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert client.is_server_live()
        assert not client.is_server_ready()

    # New requests are still admitted, on every path, until the lame duck ends.
    late = http_infer(server, "late_http", 0.0)
    assert late.status_code == 200, late.text
    assert late.headers.get("Connection", "").lower() == "close"
    late_grpc = grpc_infer(server, "late_grpc", 0.0)
    assert list(late_grpc) == [0.0, 1.0, 1.0], late_grpc
    # The idle keep-alive connection is answered once more, told to close, and closed.
    reply = infer_on(idle, "late_idle")
    assert reply.startswith(b"HTTP/1.1 200"), reply
    assert b"\r\nconnection: close\r\n" in reply.lower()
    assert idle.recv(1) == b""
    idle.close()
    assert time.monotonic() - signalled < LAME_DUCK_S, "the checks outlived the lame duck"

    server.wait_for_line("lame duck over", timeout=LAME_DUCK_S + 10)
    code = server.wait(30)
    assert code == 0, server.log()
    results = busy.join()
    assert results["long"].status_code == 200, results["long"].text
    for key in ("late_http", "late_grpc", "late_idle"):
        assert records.events(key) == ["start", "done"], key
    assert "1 request(s) drained, 0 cancelled" in server.lines[-1]


def test_sigint_skips_the_lame_duck(lame_duck_server: tuple[TritiumProcess, Records]) -> None:
    server, _ = lame_duck_server
    signalled = time.monotonic()
    server.signal(signal.SIGINT)
    assert server.wait(30) == 0, server.log()
    assert time.monotonic() - signalled < LAME_DUCK_S
    assert "lame duck" not in server.log()
