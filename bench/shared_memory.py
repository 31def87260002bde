"""perf_analyzer with tensors in the request and in system shared memory, side by side.

Starts ``tritium serve --allow-client-shm=true`` on the bundled example repository and loads
its ``identity`` model ([1,N] FP32) with Triton's perf_analyzer
(``bench/install_perf_analyzer.sh``), once with ``--shared-memory none`` and once with
``--shared-memory system`` (perf_analyzer registers its regions, writes each input there once
and has every output written into its own region), over HTTP and gRPC.

    python bench/shared_memory.py [--seconds 5] [--elements 4096 65536] [--concurrency 1 4]
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import cast

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from driver import REPOSITORY  # noqa: E402
from table import Row, find_perf_analyzer, with_cpu  # noqa: E402
from tests.server_process import TritiumProcess  # noqa: E402


def row(binary: str, server: TritiumProcess, protocol: str, memory: str, elements: int,
        concurrency: int, seconds: float) -> Row | str:
    """The figures, or why perf_analyzer gave none (its last line)."""
    url = server.http_url if protocol == "http" else server.grpc_url
    with tempfile.NamedTemporaryFile(suffix=".csv") as report:
        command = [binary, "-m", "identity", "-u", url, "-i", protocol,
                   "--shape", f"INPUT0:{elements}", "--concurrency-range", str(concurrency),
                   "--shared-memory", memory, "--output-shared-memory-size", str(elements * 4),
                   "-p", str(int(seconds * 1000)), "-f", report.name,
                   # Shared cores are noisy: any spread between the last 3 windows is
                   # accepted (this compares two runs side by side, not absolute figures).
                   "-s", "100", "-r", "10"]
        result, cpu_us = with_cpu(server, lambda: subprocess.run(
            command, capture_output=True, text=True, timeout=600))
        done = cast("subprocess.CompletedProcess[str]", result)
        if done.returncode != 0:
            lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
            return f"perf_analyzer exit {done.returncode}: {lines[-1] if lines else ''}"
        with open(report.name) as figures:
            found = next(csv.DictReader(figures))
    return Row(float(found["Inferences/Second"]), float(found["p50 latency"]) / 1e3,
               float(found["p99 latency"]) / 1e3, cpu_us)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--elements", type=int, nargs="+", default=[4096, 65536])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args()
    binary = find_perf_analyzer()
    if binary is None:
        raise SystemExit("perf_analyzer not found: run bench/install_perf_analyzer.sh")
    server = TritiumProcess(REPOSITORY, "--allow-client-shm=true").start()
    try:
        print(f"{'protocol':8s} {'memory':>6s} {'shape':>8s} {'conc':>4s} {'infer/s':>9s} "
              f"{'p50 ms':>8s} {'p99 ms':>8s} {'server CPU µs/infer':>20s}")
        for protocol in ("http", "grpc"):
            for elements in args.elements:
                for concurrency in args.concurrency:
                    for memory in ("none", "system"):
                        found = row(binary, server, protocol, memory, elements, concurrency,
                                    args.seconds)
                        if isinstance(found, str):
                            print(f"{protocol:8s} {memory:>6s} {f'[{elements}]':>8s} "
                                  f"{concurrency:4d} {found}", flush=True)
                            continue
                        print(f"{protocol:8s} {memory:>6s} {f'[{elements}]':>8s} "
                              f"{concurrency:4d} {found.infer_per_s:9.0f} {found.p50_ms:8.3f} "
                              f"{found.p99_ms:8.3f} {found.cpu_us:20.1f}", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
