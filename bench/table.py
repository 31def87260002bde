"""One table: protocol by shape by concurrency → infer/s, p50, p99, server CPU µs/inference.

Starts ``tritium serve`` on the bundled example repository and loads its ``identity``
model ([1,N] FP32) with Triton's own perf_analyzer when it is installed
(``bench/install_perf_analyzer.sh``), or else with this directory's pure-Python drivers.
Server CPU comes from the server process's own CPU time (/proc), divided by the requests
it completed during the run (``nv_inference_request_success`` on /metrics).

    python bench/table.py [--driver auto|perf_analyzer|python] [--seconds 5] [-- SERVER FLAGS]
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
import grpc_infer  # noqa: E402
import http_infer  # noqa: E402
from driver import REPOSITORY, cpu_seconds  # noqa: E402
from tests.e2e.observe import metric  # noqa: E402
from tests.server_process import TritiumProcess  # noqa: E402

SHAPES = (16, 4096)
CONCURRENCY = (1, 4, 16)


@dataclass(frozen=True)
class Row:
    infer_per_s: float
    p50_ms: float
    p99_ms: float
    cpu_us: float


def find_perf_analyzer() -> str | None:
    for candidate in (os.environ.get("PERF_ANALYZER"), str(HERE / ".perf_analyzer" /
                                                            "perf_analyzer")):
        if candidate and Path(candidate).exists():
            return candidate
    return shutil.which("perf_analyzer")


def successes(server: TritiumProcess) -> float:
    return metric(server.metrics_url, "nv_inference_request_success", model="identity")


def with_cpu(server: TritiumProcess, run: callable) -> tuple[object, float]:  # type: ignore[valid-type]
    cpu, done = cpu_seconds(server.pid), successes(server)
    result = run()
    cpu, done = cpu_seconds(server.pid) - cpu, successes(server) - done
    return result, cpu / max(done, 1) * 1e6


def perf_analyzer_row(binary: str, server: TritiumProcess, protocol: str, elements: int,
                      concurrency: int, seconds: float) -> Row:
    url = server.http_url if protocol == "http" else server.grpc_url
    with tempfile.NamedTemporaryFile(suffix=".csv") as report:
        command = [binary, "-m", "identity", "-u", url, "-i", protocol,
                   "--shape", f"INPUT0:{elements}", "--concurrency-range", str(concurrency),
                   "-p", str(int(seconds * 1000)), "-f", report.name,
                   # This 2-core machine is noisy: accept 30 % spread between windows.
                   "-s", "30", "-r", "6"]
        _, cpu_us = with_cpu(server, lambda: subprocess.run(
            command, check=True, capture_output=True, timeout=600))
        with open(report.name) as figures:
            row = next(csv.DictReader(figures))
    return Row(float(row["Inferences/Second"]), float(row["p50 latency"]) / 1e3,
               float(row["p99 latency"]) / 1e3, cpu_us)


def python_row(server: TritiumProcess, protocol: str, elements: int, concurrency: int,
               seconds: float) -> Row:
    import numpy as np
    import uvloop

    if protocol == "http":
        payload = http_infer.request_bytes("identity", elements)
        run = lambda: uvloop.run(http_infer.run(server.http_port, payload, concurrency, seconds))  # noqa: E731
    else:
        payload = grpc_infer.request_bytes("identity", elements)
        run = lambda: uvloop.run(grpc_infer.run(server.grpc_url, payload, concurrency, seconds))  # noqa: E731
    run_short = seconds
    latencies, cpu_us = with_cpu(server, run)
    lat = np.array(latencies) * 1e3
    return Row(len(lat) / run_short, float(np.percentile(lat, 50)),
               float(np.percentile(lat, 99)), cpu_us)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--driver", choices=["auto", "perf_analyzer", "python"], default="auto")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("server_args", nargs="*",
                        help="extra `tritium serve` flags, after --, e.g. -- --cpu-cores 0")
    args = parser.parse_args()
    binary = find_perf_analyzer() if args.driver != "python" else None
    if args.driver == "perf_analyzer" and binary is None:
        raise SystemExit("perf_analyzer not found: run bench/install_perf_analyzer.sh")
    driver = "perf_analyzer" if binary else "python"
    server = TritiumProcess(REPOSITORY, *args.server_args).start()
    try:
        print(f"driver: {driver}; server flags: {' '.join(args.server_args) or 'none'}")
        print(f"{'protocol':8s} {'shape':>7s} {'conc':>4s} {'infer/s':>9s} {'p50 ms':>8s} "
              f"{'p99 ms':>8s} {'server CPU µs/infer':>20s}")
        for protocol in ("http", "grpc"):
            for elements in SHAPES:
                for concurrency in CONCURRENCY:
                    if binary:
                        row = perf_analyzer_row(binary, server, protocol, elements, concurrency,
                                                args.seconds)
                    else:
                        row = python_row(server, protocol, elements, concurrency, args.seconds)
                    print(f"{protocol:8s} {f'[{elements}]':>7s} {concurrency:4d} "
                          f"{row.infer_per_s:9.0f} {row.p50_ms:8.3f} {row.p99_ms:8.3f} "
                          f"{row.cpu_us:20.1f}", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
