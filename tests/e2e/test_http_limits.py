"""The real server under hostile HTTP/1.1 and metrics clients: every bound holds, and an
unrelated client is still served promptly while the attack goes on."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import tritonclient.grpc as grpcclient

from tests.e2e.observe import metric
from tests.server_process import TritiumProcess
from tests.zoo import add_model

# Thread kind only: the HTTP transport's limits, enforced before any instance runs.
INSTANCE_KINDS = ("thread",)

PROMPT_S = 2.0  # an unrelated request during an attack must be answered within this
BOUND_S = 15.0  # generous: a wait that hits it means the bound is missing
MiB = 1024 * 1024


def binary_infer(values: int, extra: bytes = b"") -> bytes:
    """An identity_fp32 request whose input and output travel as ``4 * values`` raw bytes."""
    data = bytes(4 * values)
    header = json.dumps({
        "inputs": [{"name": "INPUT0", "shape": [values], "datatype": "FP32",
                    "parameters": {"binary_data_size": len(data)}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    }).encode()
    return (b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: t\r\n"
            b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n%s\r\n"
            % (len(header), len(header) + len(data), extra)) + header + data


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path: Path = tmp_path_factory.mktemp("limits")
    add_model(path, "identity_fp32", "identity",
              'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [-1] }]\n'
              'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [-1] }]\n')
    return path


@contextlib.contextmanager
def serving(repo: Path, *args: str) -> Iterator[TritiumProcess]:
    server = TritiumProcess(repo, *args).start()
    try:
        yield server
    finally:
        assert server.stop() == 0, server.log()


@pytest.fixture(scope="module")
def limited(repo: Path) -> Iterator[TritiumProcess]:
    with serving(repo, "--http-header-timeout-secs", "1", "--http-body-timeout-secs", "1",
                 "--http-send-timeout-secs", "1", "--http-min-body-rate", "50") as server:
        yield server


@pytest.fixture(scope="module")
def patient(repo: Path) -> Iterator[TritiumProcess]:
    """Production defaults: no timeout cuts an attack short before its bound is measured."""
    with serving(repo) as server:
        yield server


def assert_served_promptly(server: TritiumProcess) -> None:
    """A fresh client's small inference is answered within PROMPT_S."""
    started = time.monotonic()
    reply = requests.post(f"http://{server.http_url}/v2/models/identity_fp32/infer",
                          json={"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32",
                                            "data": [1.0, 2.0]}]}, timeout=BOUND_S)
    assert reply.status_code == 200
    assert time.monotonic() - started < PROMPT_S


def rss(server: TritiumProcess) -> int:
    return _status_field(server, "VmRSS") * 1024


def threads(server: TritiumProcess) -> int:
    return _status_field(server, "Threads")


def _status_field(server: TritiumProcess, name: str) -> int:
    for line in Path(f"/proc/{server.pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {name} for {server.pid}")


def cpu_seconds(server: TritiumProcess) -> float:
    fields = Path(f"/proc/{server.pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (a reset counts as closed)."""
    chunks = []
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def connect(server: TritiumProcess, port: int | None = None) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port or server.http_port), timeout=BOUND_S)


# -- write side: clients that do not read --------------------------------------------------


def test_a_pipelining_client_that_never_reads_gets_no_more_answers(patient: TritiumProcess) -> None:
    before, answered = rss(patient), answers(patient)
    batch = binary_infer(8192) * 32  # 32 KiB in and 32 KiB out, each
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", patient.http_port))
        sock.setblocking(False)
        sent = 0
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            try:
                sent += sock.send(batch)
            except BlockingIOError:
                time.sleep(0.01)  # the server stopped reading: look again shortly
        assert_served_promptly(patient)
        produced = answers(patient) - answered - 1
        growth = rss(patient) - before
    # The kernel buffers much of what was sent; the server itself answers only until its
    # write buffer is full, then reads nothing more.
    assert sent > 2 * MiB, sent  # the attack did happen
    assert produced < 200, produced
    assert growth < 64 * MiB, growth
    assert_served_promptly(patient)


def answers(server: TritiumProcess) -> int:
    return int(metric(server.metrics_url, "nv_inference_request_success", model="identity_fp32",
                      version="1"))


def test_a_client_that_never_reads_its_response_is_disconnected(limited: TritiumProcess) -> None:
    request = binary_infer(2 * MiB)  # an 8 MiB answer
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", limited.http_port))
        mark = len(limited.lines)
        sock.sendall(request)
        assert_served_promptly(limited)
        limited.wait_for_line("has not read its response", BOUND_S, start=mark)
        received = read_until_closed(sock)
    assert len(received) < 8 * MiB  # cut short: the rest was never written
    assert_served_promptly(limited)


# -- read side: clients that send too slowly ------------------------------------------------


def test_a_body_that_stops_gets_408_after_the_body_timeout(limited: TritiumProcess) -> None:
    with connect(limited) as sock:
        request = binary_infer(1024)
        sock.sendall(request[:-100])
        started = time.monotonic()
        assert_served_promptly(limited)
        reply = read_until_closed(sock)
        waited = time.monotonic() - started
    assert reply.startswith(b"HTTP/1.1 408 "), reply[:100]
    assert b"no data for 1 s" in reply
    assert 0.9 < waited < BOUND_S


def test_a_body_sent_a_byte_at_a_time_gets_408(limited: TritiumProcess) -> None:
    # Each byte comes well within the body timeout; the pace (50 bytes/s after the 5 s grace
    # period) is what gives it away.
    with connect(limited) as sock:
        request = binary_infer(1024)
        head, _, body = request.partition(b"\r\n\r\n")
        sock.sendall(head + b"\r\n\r\n")
        started = time.monotonic()
        sock.settimeout(0.3)
        reply = b""
        for byte in body[:100]:
            with contextlib.suppress(TimeoutError):
                reply = sock.recv(65536)
            if reply:
                break
            sock.sendall(bytes([byte]))
        waited = time.monotonic() - started
        assert_served_promptly(limited)
    assert reply.startswith(b"HTTP/1.1 408 "), reply[:100]
    assert b"slower than 50 bytes/s" in reply
    assert waited < BOUND_S


def test_a_head_that_stalls_gets_408_on_both_http_ports(limited: TritiumProcess) -> None:
    metrics_port = int(limited.metrics_url.split(":")[2].split("/")[0])
    for port in (limited.http_port, metrics_port):
        with connect(limited, port) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: t\r\n")
            assert_served_promptly(limited)
            reply = read_until_closed(sock)
        assert reply.startswith(b"HTTP/1.1 408 "), (port, reply[:100])


# -- closed connections are freed at once -----------------------------------------------------


def test_uploads_abandoned_midway_are_freed_at_once(patient: TritiumProcess) -> None:
    chunk = bytes(MiB)
    samples = []
    for _ in range(8):
        with connect(patient) as sock:
            sock.sendall(b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: t\r\n"
                         b"Content-Length: %d\r\n\r\n" % (40 * MiB))
            for _ in range(24):
                sock.sendall(chunk)
        assert_served_promptly(patient)  # by now the server has seen the close
        samples.append(rss(patient))
    # Each abandoned upload held 24 MiB; kept until a full collection, 6 rounds add 144 MiB.
    assert samples[-1] - samples[1] < 48 * MiB, [s // MiB for s in samples]


# -- connections: a cap per listener, and running out of descriptors ---------------------------


def test_connections_over_the_cap_get_503_and_every_other_port_still_serves(
    repo: Path
) -> None:
    with serving(repo, "--http-max-connections", "8") as server:
        kept = [connect(server) for _ in range(8)]
        for sock in kept:
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 200 ")
        started = time.monotonic()
        with connect(server) as refused:
            reply = read_until_closed(refused)
        assert reply.startswith(b"HTTP/1.1 503 ") and b"too many open connections" in reply
        assert time.monotonic() - started < PROMPT_S
        kept[0].sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n")
        assert kept[0].recv(4096).startswith(b"HTTP/1.1 200 ")
        assert requests.get(server.metrics_url, timeout=BOUND_S).status_code == 200
        assert grpcclient.InferenceServerClient(server.grpc_url).is_server_live()
        for sock in kept:
            sock.close()
        wait_until_served(server)


def wait_until_served(server: TritiumProcess) -> None:
    """Retry until a fresh connection is answered: the server frees slots as it sees closes."""
    deadline = time.monotonic() + BOUND_S
    while True:
        with connect(server) as sock:
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            if read_until_closed(sock).startswith(b"HTTP/1.1 200 "):
                return
        assert time.monotonic() < deadline, "never served again"
        time.sleep(0.05)


def test_running_out_of_descriptors_neither_spins_nor_stops_the_listener(repo: Path) -> None:
    with serving(repo) as server:
        soft, hard = resource.prlimit(server.pid, resource.RLIMIT_NOFILE)
        limit = len(os.listdir(f"/proc/{server.pid}/fd")) + 24
        resource.prlimit(server.pid, resource.RLIMIT_NOFILE, (limit, hard))
        with contextlib.ExitStack() as stack:
            # More than the descriptors left: the kernel completes every handshake into the
            # backlog, and the server's accept() fails with EMFILE.
            flood = [stack.enter_context(connect(server)) for _ in range(60)]
            time.sleep(0.3)  # let the server meet the limit
            assert len(os.listdir(f"/proc/{server.pid}/fd")) == limit
            cpu_before = cpu_seconds(server)
            time.sleep(1.0)  # a spinning accept loop would burn this second
            assert cpu_seconds(server) - cpu_before < 0.5
            readable, _, _ = select.select(flood, [], [], 0)
            assert readable  # the connections it could not keep were closed, not left hanging
        resource.prlimit(server.pid, resource.RLIMIT_NOFILE, (soft, hard))
        wait_until_served(server)
        assert_served_promptly(server)


# -- the metrics port -------------------------------------------------------------------------


def test_metrics_connections_are_capped_and_start_no_threads(limited: TritiumProcess) -> None:
    port = int(limited.metrics_url.split(":")[2].split("/")[0])
    before = threads(limited)
    with contextlib.ExitStack() as stack:
        held = [stack.enter_context(connect(limited, port)) for _ in range(64)]
        held[0].sendall(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
        assert held[0].recv(65536).startswith(b"HTTP/1.1 200 ")
        with connect(limited, port) as refused:
            assert read_until_closed(refused).startswith(b"HTTP/1.1 503 ")
        assert threads(limited) - before < 4
        assert_served_promptly(limited)


# -- section 6: Upgrade, CONNECT and Host ----------------------------------------------------------


@pytest.mark.parametrize("first", [
    b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n",
    b"CONNECT t:443 HTTP/1.1\r\nHost: t:443\r\n\r\n",
], ids=["upgrade", "connect"])
def test_nothing_after_an_upgrade_or_connect_is_read_as_a_request(
    limited: TritiumProcess, first: bytes
) -> None:
    smuggled = b"POST /v2/repository/index HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n"
    with connect(limited) as sock:
        sock.sendall(first + smuggled)
        reply = read_until_closed(sock)
    assert reply.count(b"HTTP/1.1 ") == 1, reply
    assert b"Connection: close\r\n" in reply


@pytest.mark.parametrize("head", [
    b"GET /v2/health/live HTTP/1.1\r\n\r\n",
    b"GET /v2/health/live HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
], ids=["none", "two"])
def test_a_request_without_exactly_one_host_is_400(limited: TritiumProcess, head: bytes) -> None:
    with connect(limited) as sock:
        sock.sendall(head)
        reply = read_until_closed(sock)
    assert reply.startswith(b"HTTP/1.1 400 ") and b"Host" in reply
