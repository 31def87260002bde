"""HTTP identity inference: infer/s, p50/p99 latency and server CPU µs per inference.

Starts ``tritium serve`` on the bundled example repository, drives its ``identity`` model
([1,16] FP32, binary tensor extension) with raw keep-alive sockets from one uvloop process
(the cheapest client we can write, so the 2-core machine's CPU goes to the server), and
reads the server's own CPU time from /proc before and after each run.

    python bench/http_infer.py [--seconds 5] [--concurrency 1 4 16]
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from driver import REPOSITORY, Run, binary_infer_request, cpu_seconds, main

__all__ = ["REPOSITORY", "client", "cpu_seconds", "request_bytes", "run"]


def request_bytes(model: str, elements: int) -> bytes:
    data = np.arange(elements, dtype=np.float32).tobytes()
    return binary_infer_request(model, data, [1, elements])


async def client(port: int, payloads: list[bytes], stop_at: float,
                 latencies: list[float]) -> None:
    """One keep-alive connection sending ``payloads`` in turn, each answered before the next."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    sent = 0
    while time.perf_counter() < stop_at:
        started = time.perf_counter()
        writer.write(payloads[sent % len(payloads)])
        sent += 1
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"\r\ncontent-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        assert head.startswith(b"HTTP/1.1 200"), head
        latencies.append(time.perf_counter() - started)
    writer.close()


async def run(port: int, payload: bytes, concurrency: int, seconds: float) -> list[float]:
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds
    await asyncio.gather(*(client(port, [payload], stop_at, latencies)
                           for _ in range(concurrency)))
    return latencies


def make_run(elements: int) -> Run:
    payload = request_bytes("identity", elements)
    return lambda server, concurrency, seconds: run(server.http_port, payload, concurrency,
                                                    seconds)


if __name__ == "__main__":
    main("http", __doc__, make_run)
