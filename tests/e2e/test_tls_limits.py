"""Attacks on a TLS listener by peers that connect and never say hello: they are bounded
handshakes, not connections, so they neither take the connection cap from real clients nor
hold more than a few descriptors, and every other client is served meanwhile."""

from __future__ import annotations

import contextlib
import os
import select
import socket
import ssl
import time
from collections.abc import Iterator

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient

from tests.certificates import Pki
from tests.e2e.bystander import Bystander
from tests.e2e.test_tls import TENSORS
from tests.server_process import TritiumProcess
from tests.zoo import add_model
from tritium.tls import handshake_cap

INSTANCE_KINDS = ("thread",)

MAX_CONNECTIONS = 32
HANDSHAKES = handshake_cap(MAX_CONNECTIONS)
SILENT = 200


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[TritiumProcess]:
    """HTTPS with a small connection cap beside plain gRPC; handshakes get the default
    30 s, so whatever closes silent peers sooner is the bound on handshakes."""
    repo = tmp_path_factory.mktemp("tls_limits")
    add_model(repo, "identity_fp32", "identity", TENSORS)
    process = TritiumProcess(
        repo, "--http-use-ssl", "true", "--http-server-cert", str(pki.server_cert),
        "--http-server-key", str(pki.server_key),
        "--http-max-connections", str(MAX_CONNECTIONS)).start()
    yield process
    assert process.stop() == 0, process.log()


def open_descriptors(server: TritiumProcess) -> int:
    assert server.proc is not None
    return len(os.listdir(f"/proc/{server.proc.pid}/fd"))


@contextlib.contextmanager
def silent_peers(port: int, count: int) -> Iterator[list[socket.socket]]:
    peers = []
    try:
        for _ in range(count):
            peers.append(socket.create_connection(("127.0.0.1", port), timeout=30))
        yield peers
    finally:
        for peer in peers:
            peer.close()


def closed_by_server(peers: list[socket.socket]) -> int:
    """How many of ``peers`` the server has closed (EOF or reset waiting to be read)."""
    readable, _, _ = select.select(peers, [], [], 0)
    closed = 0
    for peer in readable:
        try:
            closed += peer.recv(1) == b""
        except OSError:
            closed += 1
    return closed


def grpc_infer(server: TritiumProcess) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
        tensor.set_data_from_numpy(np.ones(1, np.float32))
        result = client.infer("identity_fp32", [tensor])
    assert result.as_numpy("OUTPUT0").tolist() == [1.0]


def test_silent_peers_take_neither_the_connection_cap_nor_descriptors(
        server: TritiumProcess, pki: Pki) -> None:
    """200 peers that never send a ClientHello, far over the cap of 32 connections: a real
    HTTPS client is served (not 503), the plain gRPC port too, the server holds at most
    the handshake cap of them and closes the others long before the handshake timeout."""
    url = f"https://{server.http_url}/v2/health/ready"
    bystander = Bystander(url, verify=str(pki.ca))
    before = open_descriptors(server)
    with silent_peers(server.http_port, SILENT) as peers, bystander.watching() as latencies:
        deadline = time.monotonic() + 20
        while closed_by_server(peers) < SILENT - HANDSHAKES - 8:
            assert time.monotonic() < deadline, closed_by_server(peers)
            time.sleep(0.1)
        assert open_descriptors(server) - before <= HANDSHAKES + 8
        for _ in range(3):  # each a new connection with its own handshake
            reply = requests.get(url, verify=str(pki.ca), timeout=30)
            assert reply.status_code == 200, reply.text
        grpc_infer(server)
    bystander.close()
    bystander.assert_served(latencies)
    server.wait_for_line("TLS handshakes under way, the most allowed")


def test_a_client_that_finishes_its_handshake_is_a_connection(
        server: TritiumProcess, pki: Pki) -> None:
    """The cap still holds for real connections: the 33rd open HTTPS connection is told 503
    once its handshake is done."""
    context = ssl.create_default_context(cafile=str(pki.ca))
    opened = []
    try:
        for _ in range(MAX_CONNECTIONS):
            raw = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
            opened.append(context.wrap_socket(raw, server_hostname="127.0.0.1"))
        extra = context.wrap_socket(
            socket.create_connection(("127.0.0.1", server.http_port), timeout=30),
            server_hostname="127.0.0.1")
        opened.append(extra)
        assert extra.recv(1024).startswith(b"HTTP/1.1 503")
    finally:
        for tls in opened:
            tls.close()
    deadline = time.monotonic() + 20
    while True:  # the server notices the closes and serves again
        with contextlib.suppress(requests.ConnectionError):
            if requests.get(f"https://{server.http_url}/v2/health/ready",
                            verify=str(pki.ca), timeout=30).status_code == 200:
                break
        assert time.monotonic() < deadline
        time.sleep(0.1)
