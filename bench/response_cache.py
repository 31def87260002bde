"""Response cache: hits vs misses vs no cache, infer/s and server CPU per inference.

Writes one repository holding the same small dense model twice, ``cached`` (with
``response_cache { enable: true }``) and ``uncached``, starts ``tritium serve --cache-config
local,size=...`` on it and drives it over HTTP with the raw-socket client of
bench/http_infer.py:

- ``uncached``: the same request every time; the model runs every time;
- ``hit``: the same request to ``cached``; after the first, every answer is a hit;
- ``miss``: a new input on every request to ``cached``: lookup, execute, insert (and
  eviction, once the cache is full).

    python bench/response_cache.py [--seconds 5] [--concurrency 1 8] [--elements 256]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from driver import binary_infer_request, cpu_seconds
from http_infer import client
from tests.server_process import TritiumProcess

MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.weights = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            y = np.tanh(np.tanh(x @ self.weights) @ self.weights)
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUTPUT0", y)]))
        return responses
'''


def config(name: str, elements: int, cache: bool) -> str:
    return (f'name: "{name}"\nbackend: "python"\nmax_batch_size: 8\n'
            f'input [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {elements} ] }}]\n'
            f'output [{{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 256 ] }}]\n'
            + ("response_cache { enable: true }\n" if cache else ""))


def write_repository(root: Path, elements: int) -> Path:
    for name, cache in (("cached", True), ("uncached", False)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(MODEL)
        (root / name / "config.pbtxt").write_text(config(name, elements, cache))
    return root


def request_bytes(model: str, data: bytes) -> bytes:
    return binary_infer_request(model, data, [1, len(data) // 4])


async def drive(port: int, payloads: list[list[bytes]], seconds: float) -> list[float]:
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds
    await asyncio.gather(*(client(port, p, stop_at, latencies) for p in payloads))
    return latencies


def payloads(case: str, elements: int, concurrency: int, unique: int) -> list[list[bytes]]:
    model = "uncached" if case == "uncached" else "cached"
    if case != "miss":
        same = request_bytes(model, np.arange(elements, dtype=np.float32).tobytes())
        return [[same] for _ in range(concurrency)]
    # Distinct inputs per client, more than a run sends: every request misses.
    rng = np.random.default_rng(1)
    return [[request_bytes(model, rng.standard_normal(elements, dtype=np.float32).tobytes())
             for _ in range(unique)] for _ in range(concurrency)]


def measure(server: TritiumProcess, case: str, elements: int, concurrency: int,
            seconds: float) -> str:
    import uvloop

    load = payloads(case, elements, concurrency, unique=40_000 // concurrency)
    uvloop.run(drive(server.http_port, [p[-1:] for p in load], 0.5))  # warm up
    cpu_before = cpu_seconds(server.pid)
    wall = time.perf_counter()
    latencies = uvloop.run(drive(server.http_port, load, seconds))
    wall = time.perf_counter() - wall
    cpu = cpu_seconds(server.pid) - cpu_before
    lat = np.array(latencies) * 1e3
    return (f"{case:8s} c={concurrency:<3d} {len(lat) / wall:9.0f} infer/s  "
            f"p50 {np.percentile(lat, 50):7.3f} ms  p99 {np.percentile(lat, 99):7.3f} ms  "
            f"server CPU {cpu / len(lat) * 1e6:7.1f} µs/infer")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--elements", type=int, default=256)
    parser.add_argument("--cache-bytes", type=int, default=16 * 1024 * 1024)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repository = write_repository(Path(tmp), args.elements)
        server = TritiumProcess(repository, "--cache-config",
                                f"local,size={args.cache_bytes}").start()
        try:
            for concurrency in args.concurrency:
                for case in ("uncached", "miss", "hit"):
                    print(measure(server, case, args.elements, concurrency, args.seconds),
                          flush=True)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
