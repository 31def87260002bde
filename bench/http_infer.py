"""HTTP identity inference: infer/s, p50/p99 latency and server CPU µs per inference.

Starts ``tritium serve`` on the bundled example repository, drives its ``identity`` model
([1,16] FP32, binary tensor extension) with raw keep-alive sockets from one uvloop process
(the cheapest client we can write, so the 2-core machine's CPU goes to the server), and
reads the server's own CPU time from /proc before and after each run.

    python bench/http_infer.py [--seconds 5] [--concurrency 1 4 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.server_process import TritiumProcess

REPOSITORY = Path(__file__).resolve().parent.parent / "src" / "tritium" / "example_repository"


def request_bytes(model: str, elements: int) -> bytes:
    data = np.arange(elements, dtype=np.float32).tobytes()
    header = json.dumps({
        "inputs": [{"name": "INPUT0", "shape": [1, elements], "datatype": "FP32",
                    "parameters": {"binary_data_size": len(data)}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    }).encode()
    return (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: bench\r\n"
            f"Inference-Header-Content-Length: {len(header)}\r\n"
            f"Content-Length: {len(header) + len(data)}\r\n\r\n").encode() + header + data


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def client(port: int, payload: bytes, stop_at: float, latencies: list[float]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    while time.perf_counter() < stop_at:
        started = time.perf_counter()
        writer.write(payload)
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"\r\ncontent-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        assert head.startswith(b"HTTP/1.1 200"), head
        latencies.append(time.perf_counter() - started)
    writer.close()


async def run(port: int, payload: bytes, concurrency: int, seconds: float) -> list[float]:
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds
    await asyncio.gather(*(client(port, payload, stop_at, latencies) for _ in range(concurrency)))
    return latencies


def measure(server: TritiumProcess, payload: bytes, concurrency: int, seconds: float) -> str:
    import uvloop

    uvloop.run(run(server.http_port, payload, concurrency, 0.5))  # warm up
    cpu_before = cpu_seconds(server.pid)
    wall = time.perf_counter()
    latencies = uvloop.run(run(server.http_port, payload, concurrency, seconds))
    wall = time.perf_counter() - wall
    cpu = cpu_seconds(server.pid) - cpu_before
    lat = np.array(latencies) * 1e3
    return (f"http  c={concurrency:<3d} {len(lat) / wall:9.0f} infer/s  "
            f"p50 {np.percentile(lat, 50):7.3f} ms  p99 {np.percentile(lat, 99):7.3f} ms  "
            f"server CPU {cpu / len(lat) * 1e6:6.1f} µs/infer")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--elements", type=int, default=16)
    args = parser.parse_args()
    server = TritiumProcess(REPOSITORY).start()
    try:
        payload = request_bytes("identity", args.elements)
        for concurrency in args.concurrency:
            print(measure(server, payload, concurrency, args.seconds), flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
