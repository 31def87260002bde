"""tritium's /metrics beside a real Triton's on the same repository after the same traffic:
which families each exports, their types, the CPU gauges, and identity's request counters.

Needs the reference Triton of ../shared/anchors/triton (its setup.sh run once).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import requests
import tritonclient.http as httpclient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.e2e.proxies import free_port
from tests.server_process import TritiumProcess

ROOT = Path(__file__).resolve().parent.parent
REPOSITORY = ROOT / "src" / "tritium" / "example_repository"
ANCHOR = ROOT.parent / "shared" / "anchors" / "triton"
SAMPLE = re.compile(r"^(\w+)(\{[^}]*\})? (\S+)$")


def start_triton(repository: Path, interval_ms: int, run_dir: Path) -> dict[str, int]:
    ports = {"HTTP_PORT": free_port(), "GRPC_PORT": free_port(), "METRICS_PORT": free_port()}
    env = {**os.environ, "MODEL_REPO": str(repository), "RUN_DIR": str(run_dir),
           "TRITON_EXTRA_ARGS": f"--metrics-interval-ms={interval_ms}",
           **{key: str(value) for key, value in ports.items()}}
    subprocess.run(["bash", str(ANCHOR / "start.sh")], env=env, check=True,
                   stdout=subprocess.DEVNULL, timeout=180)
    return ports


def stop_triton(run_dir: Path) -> None:
    subprocess.run(["bash", str(ANCHOR / "stop.sh")], env={**os.environ, "RUN_DIR": str(run_dir)},
                   check=False, stdout=subprocess.DEVNULL)


def traffic(http_url: str, count: int) -> None:
    client = httpclient.InferenceServerClient(http_url)
    tensor = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
    for _ in range(count):
        client.infer("identity", [tensor])


def exposition(url: str) -> tuple[dict[str, str], dict[str, str]]:
    """(family -> type, "name{labels}" -> value) of one scrape."""
    text = requests.get(url, timeout=10).text
    types = dict(re.findall(r"^# TYPE (\w+) (\w+)$", text, re.MULTILINE))
    samples = {}
    for line in text.splitlines():
        found = SAMPLE.match(line)
        if found:
            samples[found[1] + (found[2] or "")] = found[3]
    return types, samples


def family_table(triton: dict[str, str], tritium: dict[str, str]) -> None:
    print(f"{'family':48s} {'Triton 2.51':12s} tritium")
    for name in sorted(set(triton) | set(tritium)):
        print(f"{name:48s} {triton.get(name, '-'):12s} {tritium.get(name, '-')}")


def value_table(triton: dict[str, str], tritium: dict[str, str]) -> None:
    keys = ["nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes",
            *(f'{name}{{model="identity",version="1"}}' for name in (
                "nv_inference_request_success", "nv_inference_count", "nv_inference_exec_count",
                "nv_inference_pending_request_count"))]
    print(f"\n{'sample':72s} {'Triton 2.51':>16s} {'tritium':>16s}")
    for key in keys:
        print(f"{key:72s} {triton.get(key, '-'):>16s} {tritium.get(key, '-'):>16s}")
    total_kb = re.search(r"^MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text(), re.MULTILINE)
    assert total_kb is not None
    print(f"{'/proc/meminfo MemTotal, bytes':72s} {int(total_kb[1]) * 1024:>16d}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--interval-ms", type=int, default=500)
    args = parser.parse_args()
    run_dir = Path(os.environ.get("TMPDIR", "/tmp")) / "metrics-side-by-side"
    ports = start_triton(REPOSITORY, args.interval_ms, run_dir)
    tritium = TritiumProcess(REPOSITORY, "--metrics-interval-ms", str(args.interval_ms)).start()
    try:
        traffic(f"127.0.0.1:{ports['HTTP_PORT']}", args.requests)
        traffic(tritium.http_url, args.requests)
        time.sleep(3 * args.interval_ms / 1000)  # both have polled their CPU gauges since
        theirs = exposition(f"http://127.0.0.1:{ports['METRICS_PORT']}/metrics")
        ours = exposition(tritium.metrics_url)
    finally:
        tritium.stop()
        stop_triton(run_dir)
    family_table(theirs[0], ours[0])
    value_table(theirs[1], ours[1])


if __name__ == "__main__":
    main()
