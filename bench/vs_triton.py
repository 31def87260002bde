"""The process instance kind beside Triton 2.51's python backend, on one repository, in one run.

Three servers serve the same repository at once: Triton 2.51 (../shared/anchors/triton, its
setup.sh run once), ``tritium serve --python-instance-kind process`` and ``... thread``. The same
client (bench/http_infer.py and bench/grpc_infer.py: raw keep-alive sockets / one gRPC channel,
from this process) drives each in turn, round after round (A/B/C, A/B/C, ...), so every ratio
comes from the same minutes of a shared machine:

  1. identity [1,16] FP32 over HTTP and gRPC at concurrency 1 and 16: server CPU per inference
     of every process of each server (Triton: the server and its stubs; tritium: the server,
     the guardians and the instance processes), and for the process kind how much of it
     was the server's own process;
  2. 2 instances of a pure-Python ~4 ms execute (tests/models/busy.py), HTTP concurrency 4:
     infer/s.

Each line gives the median over the rounds and Triton's figure divided by ours (for CPU: above
1.0 means we spend less; for infer/s: above 1.0 means Triton serves more... so that one is
printed as ours / Triton's).

    python bench/vs_triton.py [--rounds 5] [--seconds 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import uvloop

BENCH = Path(__file__).resolve().parent
EXAMPLE_IDENTITY = (BENCH.parent / "src" / "tritium" / "example_repository" / "identity" / "1"
                    / "model.py")
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))
import grpc_infer  # noqa: E402
import http_infer  # noqa: E402
from driver import cpu_seconds, tree_cpu  # noqa: E402
from metrics_side_by_side import start_triton, stop_triton  # noqa: E402
from process_instances import EXECUTE_MS, calibrate  # noqa: E402
from tests.server_process import TritiumProcess  # noqa: E402
from tests.zoo import _parameter, _tensor, add_model  # noqa: E402

Drive = Callable[[str, int, float], list[float]]


def build(repo: Path, turns: int) -> None:
    """identity (one instance) and busy (two), as a Triton user writes them."""
    batched = ('backend: "python"\nmax_batch_size: 8\n'
               + _tensor("input", "INPUT0", "FP32", "-1")
               + _tensor("output", "OUTPUT0", "FP32", "-1"))
    model = add_model(repo, "identity", "identity",
                      batched + "instance_group [{ count: 1 kind: KIND_CPU }]\n")
    # The bundled example's model: the zoo's identity asks triton_dtype(), which Triton
    # 2.51's binding cannot return for every type.
    shutil.copy(EXAMPLE_IDENTITY, model / "1" / "model.py")
    add_model(repo, "busy", "busy", batched + _parameter("iterations", str(turns))
              + "instance_group [{ count: 2 kind: KIND_CPU }]\n")


def http_drive(port: int) -> Drive:
    return lambda model, c, seconds: uvloop.run(
        http_infer.run(port, http_infer.request_bytes(model, 16), c, seconds))


def grpc_drive(url: str) -> Drive:
    return lambda model, c, seconds: uvloop.run(
        grpc_infer.run(url, grpc_infer.request_bytes(model, 16), c, seconds))


def window(pid: int, drive: Drive, model: str, c: int,
           seconds: float) -> tuple[float, float, float]:
    """(infer/s, CPU µs per inference of every process of the server, of its main process
    alone) of one warmed-up window."""
    drive(model, c, 0.3)
    cpu, main, wall = tree_cpu(pid), cpu_seconds(pid), time.perf_counter()
    count = len(drive(model, c, seconds))
    wall, cpu, main = (time.perf_counter() - wall, tree_cpu(pid) - cpu,
                       cpu_seconds(pid) - main)
    return count / wall, cpu / count * 1e6, main / count * 1e6


class Servers:
    """name -> (pid, HTTP drive, gRPC drive) of the three servers, up at once."""

    def __init__(self, stack: ExitStack, repo: Path, scratch: Path) -> None:
        self.found: dict[str, tuple[int, Drive, Drive]] = {}
        ports = start_triton(repo, 2000, scratch / "triton")
        stack.callback(stop_triton, scratch / "triton")
        pid = int((scratch / "triton" / "tritonserver.pid").read_text())
        self.found["triton"] = (pid, http_drive(ports["HTTP_PORT"]),
                                grpc_drive(f"127.0.0.1:{ports['GRPC_PORT']}"))
        for kind in ("process", "thread"):
            server = TritiumProcess(repo, "--python-instance-kind", kind).start(120)
            stack.callback(server.stop)
            self.found[kind] = (server.pid, http_drive(server.http_port),
                                grpc_drive(server.grpc_url))


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def identity(servers: Servers, rounds: int, seconds: float) -> None:
    print("1. identity [1,16] FP32: server CPU µs per inference, all processes (median of "
          f"{rounds} rounds)", flush=True)
    for protocol in ("HTTP", "gRPC"):
        for c in (1, 16):
            cpu: dict[str, list[float]] = {name: [] for name in servers.found}
            main: dict[str, list[float]] = {name: [] for name in servers.found}
            rate: dict[str, list[float]] = {name: [] for name in servers.found}
            for _ in range(rounds):
                for name, (pid, http, grpc) in servers.found.items():
                    drive = http if protocol == "HTTP" else grpc
                    got_rate, got_cpu, got_main = window(pid, drive, "identity", c, seconds)
                    rate[name].append(got_rate)
                    cpu[name].append(got_cpu)
                    main[name].append(got_main)
            triton = median(cpu["triton"])
            cells = "  ".join(f"{name} {median(cpu[name]):6.1f} µs {median(rate[name]):5.0f}/s"
                              for name in servers.found)
            print(f"  {protocol} c={c:<2d} {cells}  | Triton/process "
                  f"{triton / median(cpu['process']):.2f}x  Triton/thread "
                  f"{triton / median(cpu['thread']):.2f}x  process/thread "
                  f"{median(cpu['process']) / median(cpu['thread']):.2f}x", flush=True)
            served = median(main["process"])
            print(f"{'':13s}process kind: server {served:6.1f} µs + instance processes "
                  f"and guardians {median(cpu['process']) - served:5.1f} µs", flush=True)


def parallel(servers: Servers, rounds: int, seconds: float) -> None:
    print(f"2. busy (~{EXECUTE_MS:g} ms pure-Python execute), 2 instances, HTTP c=4: infer/s "
          f"(median of {rounds} rounds)", flush=True)
    rate: dict[str, list[float]] = {name: [] for name in servers.found}
    for _ in range(rounds):
        for name, (pid, http, _) in servers.found.items():
            rate[name].append(window(pid, http, "busy", 4, seconds)[0])
    triton = median(rate["triton"])
    cells = "  ".join(f"{name} {median(rate[name]):5.0f}/s" for name in servers.found)
    print(f"  {cells}  | process/Triton {median(rate['process']) / triton:.2f}x  "
          f"thread/Triton {median(rate['thread']) / triton:.2f}x", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--only", choices=["identity", "busy"], default=None)
    args = parser.parse_args()
    turns = calibrate(EXECUTE_MS)
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
          f"busy execute: {turns} loop turns", flush=True)
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        repo = Path(tmp) / "repo"
        build(repo, turns)
        servers = Servers(stack, repo, Path(tmp))
        if args.only != "busy":
            identity(servers, args.rounds, args.seconds)
        if args.only != "identity":
            parallel(servers, args.rounds, args.seconds)
    print(f"load average at end: {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
