"""After a graceful GOAWAY the server closes its gRPC connections without a reset, even when
the peer's bytes cross the GOAWAY: a proxy that opened one more stream on a draining replica
must still read the trailers of the last answer (a reset made HAProxy drop them)."""

from __future__ import annotations

import errno
import signal
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.proxies import build_replica_repository
from tests.server_process import TritiumProcess
from tritium.frontends.grpc.http2 import FrameType, frame

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
TCP_CLOSE_WAIT = 8  # linux/tcp_states.h
SETTLE_S = 0.5  # far longer than a reset takes to cross loopback


def tcp_state(sock: socket.socket) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]


@pytest.fixture()
def lame_duck_server(tmp_path: Path) -> Iterator[TritiumProcess]:
    repo = build_replica_repository(tmp_path / "repo", tmp_path)
    server = TritiumProcess(repo, "--lame-duck-secs", "3").start()
    yield server
    server.stop()


def test_bytes_crossing_the_goaway_do_not_reset_the_connection(
        lame_duck_server: TritiumProcess) -> None:
    port = lame_duck_server.ports["gRPC"]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(PREFACE + frame(FrameType.SETTINGS, 0, 0, b""))
        assert sock.recv(65536)  # the server's SETTINGS: the connection is HTTP/2
        lame_duck_server.signal(signal.SIGTERM)
        # The first GOAWAY and its PING, answered as a proxy answers: the final GOAWAY follows.
        answer_the_leaving_ping(sock)
        deadline = time.monotonic() + 10
        while tcp_state(sock) != TCP_CLOSE_WAIT:  # the server's GOAWAY and FIN are here
            assert time.monotonic() < deadline, "the idle connection was not closed"
            time.sleep(0.01)
        # What a proxy sends before it has read the GOAWAY: a ping (or a new stream).
        sock.sendall(frame(FrameType.PING, 0, 0, struct.pack(">Q", 1)))
        time.sleep(SETTLE_S)
        error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        assert error == 0, f"the server reset the connection: {errno.errorcode.get(error)}"
        assert tcp_state(sock) == TCP_CLOSE_WAIT
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        assert FrameType.GOAWAY in frame_types(received), received


def answer_the_leaving_ping(sock: socket.socket) -> None:
    received = b""
    while True:
        chunk = sock.recv(65536)
        assert chunk, "closed before the PING that follows the first GOAWAY"
        received += chunk
        pos = 0
        while pos + 9 <= len(received):
            length = int.from_bytes(received[pos:pos + 3], "big")
            if received[pos + 3] == FrameType.PING and not received[pos + 4] & 0x1 \
                    and pos + 9 + length <= len(received):
                payload = received[pos + 9:pos + 9 + length]
                sock.sendall(frame(FrameType.PING, 0x1, 0, payload))
                return
            pos += 9 + length


def frame_types(data: bytes) -> list[int]:
    types, pos = [], 0
    while pos + 9 <= len(data):
        types.append(data[pos + 3])
        pos += 9 + int.from_bytes(data[pos:pos + 3], "big")
    return types
