"""The cost of one BLS round trip from model code, process kind and thread kind: a model
calls identity_fp32 ``--calls`` times in a loop inside one execute (blocking ``exec()``,
then ``exec(decoupled=True)`` read to its end) and reports the mean wall time per call,
and the CPU time per call of every process of the server (the server, its guardians and
instance processes), which wanders less on a busy machine.

    python bench/bls_roundtrip.py [--calls 2000] [--width 16] [--trials 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import requests

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))
from driver import tree_cpu  # noqa: E402
from tests.server_process import TritiumProcess  # noqa: E402
from tests.zoo import _parameter, _tensor, add_model  # noqa: E402


def build(repo: Path) -> None:
    add_model(repo, "identity_fp32", "identity", 'backend: "python"\n'
              + _tensor("input", "INPUT0", "FP32", "-1")
              + _tensor("output", "OUTPUT0", "FP32", "-1"))
    for kind in ("process", "thread"):
        add_model(repo, f"bls_loop_{kind}", "bls_loop", 'backend: "python"\n'
                  + _tensor("input", "INPUT0", "INT32", "2")
                  + _tensor("output", "OUTPUT0", "FP64", "2")
                  + _parameter("TRITIUM_INSTANCE_KIND", kind))


def measure(server: TritiumProcess, model: str, calls: int, width: int) -> tuple[float, float]:
    body = {"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "INT32",
                        "data": [calls, width]}]}
    reply = requests.post(f"http://{server.http_url}/v2/models/{model}/infer", json=body,
                          timeout=600)
    reply.raise_for_status()
    single, stream = reply.json()["outputs"][0]["data"]
    return single / 1000, stream / 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        build(repo)
        server = TritiumProcess(repo).start()
        try:
            for kind in ("process", "thread"):
                model = f"bls_loop_{kind}"
                measure(server, model, 100, args.width)  # warm up
                runs, cpus = [], []
                for _ in range(args.trials):
                    before = tree_cpu(server.pid)
                    runs.append(measure(server, model, args.calls, args.width))
                    cpus.append((tree_cpu(server.pid) - before) / (2 * args.calls) * 1e6)
                single = statistics.median(r[0] for r in runs)
                stream = statistics.median(r[1] for r in runs)
                print(f"BLS {kind:7s} exec(): {single:7.1f} us/call   "
                      f"exec(decoupled=True): {stream:7.1f} us/call   "
                      f"CPU (all processes, both): {statistics.median(cpus):6.1f} us/call   "
                      f"(median of {args.trials} x {args.calls}, FP32[{args.width}])")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
