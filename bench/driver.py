"""What the load drivers share: the server's CPU time, one measured run, the command line."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.server_process import TritiumProcess

REPOSITORY = Path(__file__).resolve().parent.parent / "src" / "tritium" / "example_repository"

# (server, concurrency, seconds) -> the latency of every request, in seconds
Run = Callable[[TritiumProcess, int, float], Awaitable[list[float]]]


def binary_infer_request(model: str, data: bytes, shape: list[int]) -> bytes:
    """A whole HTTP /infer request with one FP32 input ``data`` of ``shape`` as binary data,
    asking for OUTPUT0 back as binary data."""
    header = json.dumps({
        "inputs": [{"name": "INPUT0", "shape": shape, "datatype": "FP32",
                    "parameters": {"binary_data_size": len(data)}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    }).encode()
    return (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: bench\r\n"
            f"Inference-Header-Content-Length: {len(header)}\r\n"
            f"Content-Length: {len(header) + len(data)}\r\n\r\n").encode() + header + data


def _parent_of(entry: str) -> int:
    return int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])


def descendants(pid: int) -> dict[int, int]:
    """Every live process below ``pid`` (instance processes sit under their guardians),
    each with its parent."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):  # it may have just exited
                parents.setdefault(_parent_of(entry), []).append(int(entry))
    found: dict[int, int] = {}
    todo = [pid]
    while todo:
        parent = todo.pop()
        for child in parents.get(parent, []):
            found[child] = parent
            todo.append(child)
    return found


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and every process below it (the guardians and instance
    processes of a server, the stubs of Triton)."""
    total = cpu_seconds(pid)
    for child in descendants(pid):
        with contextlib.suppress(OSError):  # it may have just exited
            total += cpu_seconds(child)
    return total


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(label: str, server: TritiumProcess, run: Run, concurrency: int,
            seconds: float) -> str:
    """One warmed-up run: infer/s, p50/p99 latency and the server's CPU per request."""
    import uvloop

    uvloop.run(run(server, concurrency, 0.5))
    cpu_before = cpu_seconds(server.pid)
    wall = time.perf_counter()
    latencies = uvloop.run(run(server, concurrency, seconds))
    wall = time.perf_counter() - wall
    cpu = cpu_seconds(server.pid) - cpu_before
    lat = np.array(latencies) * 1e3
    return (f"{label:5s} c={concurrency:<3d} {len(lat) / wall:9.0f} infer/s  "
            f"p50 {np.percentile(lat, 50):7.3f} ms  p99 {np.percentile(lat, 99):7.3f} ms  "
            f"server CPU {cpu / len(lat) * 1e6:6.1f} µs/infer")


def main(label: str, description: str | None, make_run: Callable[[int], Run]) -> None:
    """``make_run(elements)`` gives the run for tensors of that many FP32 elements."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--elements", type=int, default=16)
    parser.add_argument("server_args", nargs="*",
                        help="extra `tritium serve` flags, after --, e.g. -- --cpu-cores 0")
    args = parser.parse_args()
    server = TritiumProcess(REPOSITORY, *args.server_args).start()
    try:
        run = make_run(args.elements)
        for concurrency in args.concurrency:
            print(measure(label, server, run, concurrency, args.seconds), flush=True)
    finally:
        server.stop()
