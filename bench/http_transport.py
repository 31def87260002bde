"""Requests/s and server CPU per request of the bare HTTP transport (keep-alive, 20-byte body).

Usage: PYTHONPATH=src python bench/http_transport.py [--clients 32] [--seconds 5]

The server runs in a child process under uvloop with an app that answers 200 at once; the
clients are raw keep-alive connections in this process, each sending its next request as
soon as the previous response has arrived. Server CPU comes from /proc/<pid>/stat.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time

import uvloop

BODY = b'{"ok": true, "n": 1}'  # 20 bytes
REQUEST = (
    b"POST /v2/models/m/infer HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
    b"Content-Length: 20\r\n\r\n" + BODY
)


async def serve() -> None:
    from tritium.frontends.http.exchange import HttpExchange
    from tritium.frontends.http.limits import HttpLimits
    from tritium.frontends.http.transport import start_http_server

    headers = [("Content-Type", "application/json")]

    async def app(exchange: HttpExchange) -> None:
        exchange.respond(200, headers, BODY)

    server = await start_http_server(app, "127.0.0.1", 0, HttpLimits())
    print(server.port, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until closed
    server.close()


class Client(asyncio.Protocol):
    """Sends a request, waits for the whole (fixed-size) response, repeats."""

    def __init__(self, response_size: int, counter: list[int]):
        self.response_size = response_size
        self.counter = counter
        self.buffered = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(REQUEST)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.buffered += len(data)
        while self.buffered >= self.response_size:
            self.buffered -= self.response_size
            self.counter[0] += 1
            assert self.transport is not None
            self.transport.write(REQUEST)


async def response_size(port: int) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(REQUEST)
    head = await reader.readuntil(b"\r\n\r\n")
    writer.close()
    return len(head) + len(BODY)


def cpu_seconds(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of a process so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


async def drive(port: int, pid: int, clients: int, seconds: float) -> None:
    loop = asyncio.get_running_loop()
    size = await response_size(port)
    counter = [0]
    transports = []
    for _ in range(clients):
        transport, _ = await loop.create_connection(lambda: Client(size, counter),
                                                    "127.0.0.1", port)
        transports.append(transport)
    await asyncio.sleep(1.0)  # warm-up
    start_count, start_cpu, start = counter[0], cpu_seconds(pid), time.perf_counter()
    await asyncio.sleep(seconds)
    done, elapsed = counter[0] - start_count, time.perf_counter() - start
    user, system = (end - begin for end, begin in zip(cpu_seconds(pid), start_cpu, strict=True))
    for transport in transports:
        transport.close()
    cpu = user + system
    print(f"{clients} keep-alive clients, {elapsed:.1f} s: {done / elapsed:,.0f} requests/s, "
          f"server CPU {cpu / done * 1e6:.1f} µs/request (user {user / done * 1e6:.1f}, "
          f"system {system / done * 1e6:.1f}; {cpu / elapsed:.0%} of a core)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        uvloop.run(serve())
        return
    child = subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, env=os.environ)
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        uvloop.run(drive(port, child.pid, args.clients, args.seconds))
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(10)


if __name__ == "__main__":
    main()
