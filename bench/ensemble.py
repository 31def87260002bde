"""What an ensemble costs: a 3-step identity ensemble per inference vs three direct calls.

Writes a repository of three python identity models ([16] FP32) and an ensemble chaining
them, starts ``tritium serve`` on it, and drives over HTTP (raw keep-alive sockets, binary
tensors) either one request to the ensemble or the three models one after the other from
the client. Prints infer/s, p50/p99 and the server's CPU per inference (one ensemble
request, or three direct requests); the difference is what running the steps inside the
server costs or saves against a client doing the chaining.

    python bench/ensemble.py [--seconds 5] [--concurrency 1 4]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.e2e.ensemble_zoo import FP32_IO, add_ensemble
from tests.server_process import TritiumProcess
from tests.zoo import add_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from driver import binary_infer_request, cpu_seconds

STEPS = ("identity_1", "identity_2", "identity_3")


def build(repo: Path) -> None:
    for name in STEPS:
        add_model(repo, name, "identity", 'backend: "python"\n' + FP32_IO)
    tensors = ["INPUT0", "t1", "t2", "OUTPUT0"]
    add_ensemble(repo, "chain3", FP32_IO, [
        (name, {"INPUT0": tensors[i]}, {"OUTPUT0": tensors[i + 1]})
        for i, name in enumerate(STEPS)])


def request_bytes(model: str, elements: int) -> bytes:
    data = np.arange(elements, dtype=np.float32).tobytes()
    return binary_infer_request(model, data, [elements])


async def client(port: int, payloads: list[bytes], stop_at: float,
                 latencies: list[float]) -> None:
    """One inference is every payload in turn, each answered before the next is sent."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    while time.perf_counter() < stop_at:
        started = time.perf_counter()
        for payload in payloads:
            writer.write(payload)
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head
            length = int(head.lower().split(b"\r\ncontent-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
        latencies.append(time.perf_counter() - started)
    writer.close()


async def run(port: int, payloads: list[bytes], concurrency: int, seconds: float
              ) -> list[float]:
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds
    await asyncio.gather(*(client(port, payloads, stop_at, latencies)
                           for _ in range(concurrency)))
    return latencies


def measure(label: str, server: TritiumProcess, payloads: list[bytes], concurrency: int,
            seconds: float) -> float:
    import uvloop

    uvloop.run(run(server.http_port, payloads, concurrency, 0.5))  # warm up
    cpu_before = cpu_seconds(server.pid)
    wall = time.perf_counter()
    latencies = uvloop.run(run(server.http_port, payloads, concurrency, seconds))
    wall = time.perf_counter() - wall
    cpu_us = (cpu_seconds(server.pid) - cpu_before) / len(latencies) * 1e6
    lat = np.array(latencies) * 1e3
    print(f"{label:10s} c={concurrency:<3d} {len(lat) / wall:8.0f} infer/s  "
          f"p50 {np.percentile(lat, 50):7.3f} ms  p99 {np.percentile(lat, 99):7.3f} ms  "
          f"server CPU {cpu_us:7.1f} µs/infer", flush=True)
    return cpu_us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--elements", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        build(Path(tmp))
        server = TritiumProcess(Path(tmp)).start()
        try:
            ensemble = [request_bytes("chain3", args.elements)]
            direct = [request_bytes(name, args.elements) for name in STEPS]
            for concurrency in args.concurrency:
                via = measure("ensemble", server, ensemble, concurrency, args.seconds)
                by_hand = measure("direct x3", server, direct, concurrency, args.seconds)
                print(f"{'':10s} c={concurrency:<3d} ensemble - direct: "
                      f"{via - by_hand:+7.1f} µs server CPU per inference", flush=True)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
