"""The figures of the process instance kind, next to the thread kind's, in one run.

One server, one repository, every model choosing its kind with TRITIUM_INSTANCE_KIND:
  1. parallel instances: infer/s of a ~4 ms pure-Python execute with 2 instances vs 1
     (HTTP, concurrency 4), process kind, and the thread kind's 2 for contrast;
  2. identity over HTTP and gRPC at concurrency 1/4/16, both kinds: infer/s and the CPU
     per inference of every server process (the server and its instance processes);
  3. request.is_cancelled() cost inside execute(), ns per call, both kinds;
  4. idle RSS (and PSS: shared pages counted once) per instance process;
  5. cancel latency, client leaves -> the model sees is_cancelled(), p50/p99, idle and while
     other clients keep the server busy (process kind, HTTP /infer);
  6. an unrelated small (thread-kind identity) model's latency while 2 instances of the
     pure-Python model are saturated, vs idle: process kind, then thread kind.

    python bench/process_instances.py [--seconds 2] [--trials 30] [--idle-only]
                                      [-- tritium serve flags]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import uvloop

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))
import grpc_infer  # noqa: E402
import http_infer  # noqa: E402
from cancellation import http_leave, observed  # noqa: E402
from cancellation import load as http_load  # noqa: E402
from driver import descendants, tree_cpu  # noqa: E402
from tests.e2e.observe import Records  # noqa: E402
from tests.models.busy import work  # noqa: E402
from tests.server_process import TritiumProcess  # noqa: E402
from tests.zoo import _parameter, _tensor, add_model  # noqa: E402

EXECUTE_MS = 4.0


# -- the repository -------------------------------------------------------------------
def _kind(kind: str) -> str:
    return _parameter("TRITIUM_INSTANCE_KIND", kind)


def _instances(count: int) -> str:
    return f"instance_group [{{ count: {count} kind: KIND_CPU }}]\n"


def calibrate(target_ms: float) -> int:
    """Loop turns of tests/models/busy.py that take ``target_ms`` on this machine (the
    fastest of several tries: other load only ever makes a try slower)."""
    turns = 50_000
    fastest = min(_timed(turns) for _ in range(7))
    return int(turns * target_ms / fastest)


def _timed(turns: int) -> float:
    started = time.perf_counter()
    work(turns)
    return (time.perf_counter() - started) * 1e3


def build(repo: Path, records: Path, turns: int) -> None:
    batched = ("max_batch_size: 8\n" + _tensor("input", "INPUT0", "FP32", "-1")
               + _tensor("output", "OUTPUT0", "FP32", "-1"))
    busy = batched + _parameter("iterations", str(turns))
    add_model(repo, "busy_process_1", "busy", busy + _kind("process") + _instances(1))
    add_model(repo, "busy_process_2", "busy", busy + _kind("process") + _instances(2))
    add_model(repo, "busy_thread_2", "busy", busy + _kind("thread") + _instances(2))
    for kind in ("thread", "process"):
        add_model(repo, f"identity_{kind}", "identity", batched + _kind(kind))
        add_model(repo, f"cancel_cost_{kind}", "cancel_cost",
                  _tensor("input", "INPUT0", "FP32", "1")
                  + _tensor("output", "OUTPUT0", "FP32", "2") + _kind(kind))
    # bench/cancellation.py's leaving clients use a model named "slow" (and "identity").
    one = _tensor("input", "INPUT0", "FP32", "1") + _tensor("output", "OUTPUT0", "FP32", "1")
    add_model(repo, "slow", "slow", one + _parameter("record_file", str(records))
              + _kind("process") + _instances(2))
    add_model(repo, "identity", "identity", batched + _kind("process") + _instances(2))


# -- measuring --------------------------------------------------------------------------
def http_run(model: str, elements: int = 16) -> Callable[[TritiumProcess, int, float], list[float]]:
    payload = http_infer.request_bytes(model, elements)
    return lambda server, c, seconds: uvloop.run(http_infer.run(server.http_port, payload, c,
                                                                seconds))


def grpc_run(model: str) -> Callable[[TritiumProcess, int, float], list[float]]:
    payload = grpc_infer.request_bytes(model, 16)
    return lambda server, c, seconds: uvloop.run(grpc_infer.run(server.grpc_url, payload, c,
                                                                seconds))


def measured(server: TritiumProcess, run: Callable[[TritiumProcess, int, float], list[float]],
             concurrency: int, seconds: float) -> tuple[float, float, float, float]:
    """(infer/s, p50 ms, p99 ms, server CPU µs per inference, all processes)."""
    run(server, concurrency, 0.3)  # warm up
    cpu, wall = tree_cpu(server.pid), time.perf_counter()
    latencies = run(server, concurrency, seconds)
    wall, cpu = time.perf_counter() - wall, tree_cpu(server.pid) - cpu
    ms = np.array(latencies) * 1e3
    return (len(ms) / wall, float(np.percentile(ms, 50)), float(np.percentile(ms, 99)),
            cpu / len(ms) * 1e6)


def _drive(port: int, model: str, concurrency: int, seconds: float) -> None:
    payload = http_infer.request_bytes(model, 16)
    uvloop.run(http_infer.run(port, payload, concurrency, seconds))


@contextmanager
def saturated(server: TritiumProcess, model: str, concurrency: int = 4) -> Iterator[None]:
    """Clients (in another process) keep ``model`` busy until the block ends."""
    worker = multiprocessing.Process(target=_drive,
                                     args=(server.http_port, model, concurrency, 600))
    worker.start()
    time.sleep(0.5)
    try:
        yield
    finally:
        worker.kill()
        worker.join()


def rss_lines(server: TritiumProcess) -> list[str]:
    below = descendants(server.pid)
    guardians = [p for p, parent in below.items() if parent == server.pid]
    lines = []
    for role, pids in (("instance processes", [p for p, parent in below.items()
                                               if parent in guardians]),
                       ("guardians", guardians)):
        rss, pss = [], []
        for pid in pids:
            status = Path(f"/proc/{pid}/status").read_text()
            rss.append(int(status.split("VmRSS:")[1].split()[0]) / 1024)
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
            pss.append(int(rollup.split("Pss:")[1].split()[0]) / 1024)
        lines.append(f"  {len(rss)} {role}: RSS min {min(rss):.1f} / median "
                     f"{float(np.median(rss)):.1f} / max {max(rss):.1f} MiB; PSS median "
                     f"{float(np.median(pss)):.1f} MiB")
    return [*lines, "  (Triton's stub: ~40 MiB RSS)"]


def execute_ms(server: TritiumProcess, model: str) -> float:
    """The mean execute() time so far, from the model's statistics (compute_infer)."""
    import requests

    stats = requests.get(f"http://{server.http_url}/v2/models/{model}/stats",
                         timeout=30).json()["model_stats"][0]["inference_stats"]
    infer = stats["compute_infer"]
    return float(infer["ns"]) / max(int(infer["count"]), 1) / 1e6


def is_cancelled_ns(server: TritiumProcess, model: str) -> float:
    import requests

    body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1e6]}]}
    reply = requests.post(f"http://{server.http_url}/v2/models/{model}/infer", json=body,
                          timeout=120).json()
    return float(reply["outputs"][0]["data"][0])


def cancel_latency(server: TritiumProcess, records: Records, trials: int) -> str:
    leave = http_leave("slow", "infer", records)
    delays = []
    for _ in range(trials):
        rid = uuid.uuid4().hex[:12]
        left = leave(server, rid)
        delays.append((observed(records, rid) - left) * 1e3)
    return (f"p50 {np.percentile(delays, 50):6.2f} ms  p99 {np.percentile(delays, 99):6.2f} ms"
            f"  ({trials} trials)")


# -- the report -----------------------------------------------------------------------
def parallel(server: TritiumProcess, seconds: float) -> None:
    print(f"1. pure-Python ~{EXECUTE_MS:g} ms execute, HTTP concurrency 4", flush=True)
    rates = {}
    for model in ("busy_process_1", "busy_process_2", "busy_thread_2"):
        rate, p50, p99, _ = measured(server, http_run(model), 4, seconds * 2)
        rates[model] = rate
        print(f"  {model:16s} {rate:7.0f} infer/s  p50 {p50:6.2f} ms  p99 {p99:6.2f} ms  "
              f"execute {execute_ms(server, model):5.2f} ms", flush=True)
    print(f"  process kind, 2 instances vs 1: "
          f"{rates['busy_process_2'] / rates['busy_process_1']:.2f}x (target >= 1.8x); "
          f"thread kind 2 instances vs process kind 1: "
          f"{rates['busy_thread_2'] / rates['busy_process_1']:.2f}x", flush=True)


def identity(server: TritiumProcess, seconds: float) -> None:
    print("2. identity [1,16] FP32, CPU per inference of all server processes", flush=True)
    for protocol, make in (("HTTP", http_run), ("gRPC", grpc_run)):
        for concurrency in (1, 4, 16):
            cells = []
            for kind in ("thread", "process"):
                rate, p50, p99, cpu = measured(server, make(f"identity_{kind}"), concurrency,
                                               seconds)
                cells.append(f"{kind:7s} {rate:6.0f}/s p50 {p50:6.2f} p99 {p99:6.2f} ms "
                             f"{cpu:6.1f} µs")
            print(f"  {protocol} c={concurrency:<2d} " + " | ".join(cells), flush=True)


def unrelated(server: TritiumProcess, seconds: float) -> None:
    print("6. identity_thread HTTP c=1 while 2 busy instances are saturated (c=4)", flush=True)
    run = http_run("identity_thread")
    _, idle50, idle99, _ = measured(server, run, 1, seconds)
    print(f"  idle:                 p50 {idle50:6.2f} ms  p99 {idle99:6.2f} ms", flush=True)
    for model in ("busy_process_2", "busy_thread_2"):
        with saturated(server, model):
            _, p50, p99, _ = measured(server, run, 1, seconds)
        print(f"  with {model:16s} p50 {p50:6.2f} ms  p99 {p99:6.2f} ms  "
              f"({p50 / idle50:.1f}x / {p99 / idle99:.1f}x idle; target within 2x)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--idle-only", action="store_true",
                        help="print the idle RSS/PSS (4.) only, and stop")
    parser.add_argument("server_args", nargs="*",
                        help="extra `tritium serve` flags, after --, e.g. -- "
                             "--python-threads-core none")
    args = parser.parse_args()
    turns = calibrate(EXECUTE_MS)
    # Other load on the machine moves every figure: say how much there was.
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
          f"busy execute: {turns} loop turns", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        repo, record_file = Path(tmp) / "repo", Path(tmp) / "slow.jsonl"
        build(repo, record_file, turns)
        server = TritiumProcess(repo, *args.server_args).start(120)
        try:
            print("4. idle instance processes (before any load)", flush=True)
            print("\n".join(rss_lines(server)), flush=True)
            if args.idle_only:
                return
            parallel(server, args.seconds)
            identity(server, args.seconds)
            print("3. request.is_cancelled() inside execute(), ns per call (loop cost "
                  "taken off)", flush=True)
            for kind in ("thread", "process"):
                print(f"  {kind:7s} {is_cancelled_ns(server, f'cancel_cost_{kind}'):6.1f} ns",
                      flush=True)
            print("5. cancel latency, HTTP /infer, process kind (client leaves -> model "
                  "sees is_cancelled())", flush=True)
            records = Records(record_file)
            print(f"  idle    {cancel_latency(server, records, args.trials)}", flush=True)
            stop_at = time.monotonic() + 600
            loaders = [multiprocessing.Process(target=http_load, args=(server.http_port,
                                                                       stop_at))
                       for _ in range(4)]
            for loader in loaders:
                loader.start()
            try:
                print(f"  loaded  {cancel_latency(server, records, args.trials)}", flush=True)
            finally:
                for loader in loaders:
                    loader.kill()
                    loader.join()
            unrelated(server, args.seconds)
        finally:
            server.stop()
    print(f"load average at end: {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
