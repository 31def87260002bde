"""Dynamic batching on vs off: infer/s of a numpy model at concurrency 16.

Writes a one-model repository twice (max_batch_size 16, one instance; with and without
``dynamic_batching``), starts ``tritium serve`` on each, drives it with the raw-socket
HTTP client of bench/http_infer.py, and prints infer/s, latency, execute() calls per
request and the on/off ratio.

    python bench/batching.py [--seconds 5] [--concurrency 16] [--delay-us 0]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from http_infer import request_bytes, run
from tests.server_process import TritiumProcess

ELEMENTS = 256

# A small dense layer: one matmul per execute() over the whole batch, as a numpy model
# written for batching would do it.
MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.weights = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)

    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        outputs = np.tanh(np.concatenate(inputs) @ self.weights)
        responses, start = [], 0
        for x in inputs:
            part = outputs[start:start + len(x)]
            start += len(x)
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUTPUT0", part)]))
        return responses
'''

CONFIG = f"""
backend: "python"
max_batch_size: 16
input [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {ELEMENTS} ] }}]
output [{{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {ELEMENTS} ] }}]
instance_group [{{ count: 1 kind: KIND_CPU }}]
"""


def write_repository(root: Path, batching: str) -> Path:
    model_dir = root / "dense"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.py").write_text(MODEL)
    (model_dir / "config.pbtxt").write_text(CONFIG + batching)
    return root


def executions(server: TritiumProcess) -> int:
    text = requests.get(f"{server.metrics_url}", timeout=10).text
    for line in text.splitlines():
        if line.startswith("nv_inference_exec_count") and 'model="dense"' in line:
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def measure(repository: Path, concurrency: int, seconds: float) -> tuple[float, str]:
    import uvloop

    payload = request_bytes("dense", ELEMENTS)
    server = TritiumProcess(repository).start()
    try:
        uvloop.run(run(server.http_port, payload, concurrency, 0.5))  # warm up
        calls_before = executions(server)
        wall = time.perf_counter()
        latencies = uvloop.run(run(server.http_port, payload, concurrency, seconds))
        wall = time.perf_counter() - wall
        calls = executions(server) - calls_before
    finally:
        server.stop()
    lat = np.array(latencies) * 1e3
    rate = len(lat) / wall
    return rate, (f"{rate:9.0f} infer/s  p50 {np.percentile(lat, 50):7.3f} ms  "
                  f"p99 {np.percentile(lat, 99):7.3f} ms  "
                  f"{len(lat) / max(calls, 1):5.2f} requests/execute")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--delay-us", type=int, default=0,
                        help="max_queue_delay_microseconds of the batching variant")
    args = parser.parse_args()
    variants = {
        "off": "",
        "on": f"dynamic_batching {{ max_queue_delay_microseconds: {args.delay_us} }}\n",
    }
    rates = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, batching in variants.items():
            repository = write_repository(Path(tmp) / name, batching)
            rates[name], line = measure(repository, args.concurrency, args.seconds)
            print(f"batching {name:<3s} c={args.concurrency:<3d} {line}", flush=True)
    print(f"ratio on/off: {rates['on'] / rates['off']:.2f}x", flush=True)


if __name__ == "__main__":
    main()
