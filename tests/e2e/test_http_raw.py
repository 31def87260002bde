"""The real server over raw sockets: framing, limits and malformed bytes."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.server_process import TritiumProcess
from tests.zoo import add_model

# Thread kind only: raw HTTP/1.1 bytes against the HTTP transport, which never reaches an
# instance.
INSTANCE_KINDS = ("thread",)

INFER = b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: t\r\n"


def infer_body(values: list[float], request_id: str = "") -> bytes:
    return json.dumps({"id": request_id, "inputs": [
        {"name": "INPUT0", "shape": [len(values)], "datatype": "FP32", "data": values}]}).encode()


def exchange(port: int, data: bytes) -> bytes:
    """Send ``data``, then read until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def responses(raw: bytes) -> list[tuple[int, bytes]]:
    """Split a byte stream of Content-Length framed responses into (status, body)."""
    found = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        found.append((status, rest[:length]))
        raw = rest[length:]
    return found


def test_pipelined_inferences_are_answered_in_order(server: TritiumProcess) -> None:
    requests_bytes = b""
    for index in range(5):
        body = infer_body([float(index)], f"p{index}")
        requests_bytes += INFER + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    last = infer_body([9.0], "last")
    requests_bytes += (INFER + b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
                       % (len(last), last))
    answers = responses(exchange(server.http_port, requests_bytes))
    assert [status for status, _ in answers] == [200] * 6
    assert [json.loads(body)["id"] for _, body in answers] == [
        "p0", "p1", "p2", "p3", "p4", "last"]


def test_chunked_body_and_expect_continue(server: TritiumProcess) -> None:
    body = infer_body([1.0, 2.0])
    half = len(body) // 2
    chunked = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (half, body[:half], len(body) - half,
                                                       body[half:])
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        sock.sendall(INFER + b"Transfer-Encoding: chunked\r\nExpect: 100-continue\r\n"
                     b"Connection: close\r\n\r\n")
        assert sock.recv(64).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(chunked)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    ((status, answer),) = responses(reply)
    assert status == 200
    assert json.loads(answer)["outputs"][0]["data"] == [1.0, 2.0]


def test_http_1_0_gets_its_answer_and_a_close(server: TritiumProcess) -> None:
    reply = exchange(server.http_port, b"GET /v2/health/live HTTP/1.0\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200") or reply.startswith(b"HTTP/1.0 200")


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"\x00\x01garbage\r\n\r\n", 400),
        (b"GET /v2/health/live HTTP/1.1\r\nBad Header\r\n\r\n", 400),
        (INFER + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
        (b"GET /v2 HTTP/1.1\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n", 431),
    ],
    ids=["garbage", "bad-header", "bad-chunk", "huge-header"],
)
def test_malformed_http_is_refused_and_the_server_stays_up(server: TritiumProcess, data: bytes,
                                                           status: int) -> None:
    reply = exchange(server.http_port, data)  # returns once the server closed the connection
    assert reply.startswith(b"HTTP/1.1 %d" % status), reply[:80]
    assert requests.get(f"http://{server.http_url}/v2/health/live", timeout=10).status_code == 200


@pytest.fixture(scope="module")
def small_limit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritiumProcess]:
    repo: Path = tmp_path_factory.mktemp("limit")
    add_model(repo, "identity_fp32", "identity",
              'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [-1] }]\n'
              'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [-1] }]\n')
    server = TritiumProcess(repo, "--http-max-input-size", "4096").start()
    yield server
    assert server.stop() == 0


def test_body_over_the_input_limit_is_413_with_a_hint(small_limit: TritiumProcess) -> None:
    # The head alone: the server answers as soon as it reads the Content-Length (sending the
    # body too could turn its close into a reset before the answer is read).
    reply = exchange(small_limit.http_port, INFER + b"Content-Length: 20000\r\n\r\n")
    ((status, answer),) = responses(reply)
    assert status == 413
    assert "--http-max-input-size" in json.loads(answer)["error"]
    small = infer_body([0.5] * 10)
    ok = requests.post(f"http://{small_limit.http_url}/v2/models/identity_fp32/infer",
                       data=small, timeout=10)
    assert ok.status_code == 200
