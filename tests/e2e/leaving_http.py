"""HTTP ways to leave: close the connection with FIN or RST, or kill the client's process."""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import time

from tests.e2e.leaving import Inputs, Sent, Way, http_raw_request
from tests.server_process import TritiumProcess

# /infer answers once, so a decoupled model is reached through the generate endpoints only.
CELLS = [("infer", "slow"), ("generate", "slow"), ("generate", "slow_decoupled"),
         ("generate_stream", "slow"), ("generate_stream", "slow_decoupled")]
HOWS = ("fin", "rst", "killed")


def body(endpoint: str, request_id: str, inputs: Inputs) -> bytes:
    if endpoint != "infer":
        return json.dumps({"id": request_id, **inputs}).encode()
    tensors = [{"name": name, "shape": [1], "datatype": "BYTES" if type(value) is str else "FP32",
                "data": [value]} for name, value in inputs.items()]
    return json.dumps({"id": request_id, "inputs": tensors}).encode()


def close(sock: socket.socket, reset: bool = False) -> None:
    if reset:  # RST instead of FIN
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def read_response(sock: socket.socket) -> tuple[bytes, bytes]:
    """One whole HTTP/1.1 response: (head, body), Content-Length or chunked."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += _recv(sock, data)
    head, rest = data.split(b"\r\n\r\n", 1)
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), None)
    if length is not None:
        while len(rest) < length:
            rest += _recv(sock, data + rest)
    else:  # chunked: the last chunk has size zero
        while not rest.endswith(b"\r\n0\r\n\r\n") and rest != b"0\r\n\r\n":
            rest += _recv(sock, data + rest)
    return head, rest


def _recv(sock: socket.socket, so_far: bytes) -> bytes:
    chunk = sock.recv(65536)
    assert chunk, f"connection closed mid-response: {so_far!r}"
    return chunk


class SocketSent(Sent):
    """The request written on a raw socket; leaving closes it (FIN, or RST with linger 0)."""

    def __init__(self, way: Way, server: TritiumProcess, request_id: str, inputs: Inputs):
        self.reset = way.how == "rst"
        self.sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
        self.sock.sendall(http_raw_request(way.model, way.route,
                                           body(way.route, request_id, inputs)))

    def leave(self) -> float:
        left_at = time.monotonic()
        close(self.sock, self.reset)
        return left_at

    def answered(self) -> None:
        head, content = read_response(self.sock)
        assert head.startswith(b"HTTP/1.1 200"), head
        assert b"OUTPUT0" in content, content

    def close(self) -> None:
        self.sock.close()


KILLABLE_CLIENT = ("import requests, sys; requests.post(sys.argv[1], data=sys.argv[2].encode(), "
                   "timeout=60)")


class KilledSent(Sent):
    """The request sent by `requests` in a child process; leaving kills that process."""

    def __init__(self, way: Way, server: TritiumProcess, request_id: str, inputs: Inputs):
        url = f"http://{server.http_url}/v2/models/{way.model}/{way.route}"
        data = body(way.route, request_id, inputs).decode()
        self.client = subprocess.Popen([sys.executable, "-c", KILLABLE_CLIENT, url, data])

    def leave(self) -> float:
        left_at = time.monotonic()
        self.close()
        return left_at

    def close(self) -> None:
        self.client.kill()
        self.client.wait()


def way(route: str, model: str, how: str) -> Way:
    return Way("http", route, model, how, "CLIENT_DISCONNECTED",
               KilledSent if how == "killed" else SocketSent, finishable=how != "killed")


def ways(cells: list[tuple[str, str]] = CELLS, hows: tuple[str, ...] = HOWS) -> list[Way]:
    return [way(route, model, how) for route, model in cells for how in hows]
