"""Sequence batching, direct strategy: N sequences at once, each stepping as fast as its
client can, over HTTP; one instance with max_batch_size slots.

Prints infer/s, latency, the requests each execute() got (real ones) and the slots it got
(padding included) for a model whose state lives in its batch slots.

    python bench/sequence_slots.py [--seconds 5] [--sequences 8] [--slots 8]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.server_process import TritiumProcess

MODEL = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        slots = max(1, json.loads(args["model_config"])["max_batch_size"])
        self.sums = np.zeros(slots, dtype=np.int64)
        self.slots = 0

    def execute(self, requests):
        responses = []
        self.slots += len(requests)
        for slot, request in enumerate(requests):
            ready = pb_utils.get_input_tensor_by_name(request, "READY").as_numpy()[0, 0]
            value = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0, 0]
            if ready:
                self.sums[slot] += value
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("SUM", np.array([[self.sums[slot]]], dtype=np.int64)),
                pb_utils.Tensor("SLOTS", np.array([[self.slots]], dtype=np.int64))]))
        return responses
'''


def config(slots: int) -> str:
    return f"""
backend: "python"
max_batch_size: {slots}
input [{{ name: "INPUT0" data_type: TYPE_INT64 dims: [ 1 ] }}]
output [{{ name: "SUM" data_type: TYPE_INT64 dims: [ 1 ] }},
        {{ name: "SLOTS" data_type: TYPE_INT64 dims: [ 1 ] }}]
sequence_batching {{
  max_sequence_idle_microseconds: 60000000
  control_input [{{ name: "READY" control [{{ kind: CONTROL_SEQUENCE_READY
                                            int32_false_true: [0, 1] }}] }}]
}}
instance_group [{{ count: 1 kind: KIND_CPU }}]
"""


def body(sequence: int, start: bool, end: bool = False) -> bytes:
    return json.dumps({
        "parameters": {"sequence_id": sequence, "sequence_start": start, "sequence_end": end},
        "inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "INT64", "data": [1]}],
    }).encode()


def client(url: str, sequence: int, until: float, latencies: list[float],
           slots: list[int]) -> None:
    with requests.Session() as session:
        first = True
        while time.perf_counter() < until:
            began = time.perf_counter()
            reply = session.post(url, data=body(sequence, first), timeout=60)
            latencies.append(time.perf_counter() - began)
            outputs = {o["name"]: o["data"][0] for o in reply.json()["outputs"]}
            slots.append(outputs["SLOTS"])
            first = False
        session.post(url, data=body(sequence, False, end=True), timeout=60)


def stats(server: TritiumProcess) -> tuple[int, int]:
    reply = requests.get(f"http://{server.http_url}/v2/models/counter/stats", timeout=10)
    model = reply.json()["model_stats"][0]
    return int(model["inference_count"]), int(model["execution_count"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--slots", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "counter"
        (model_dir / "1").mkdir(parents=True)
        (model_dir / "1" / "model.py").write_text(MODEL)
        (model_dir / "config.pbtxt").write_text(config(args.slots))
        server = TritiumProcess(Path(tmp)).start()
        try:
            url = f"http://{server.http_url}/v2/models/counter/infer"
            latencies: list[float] = []
            slots: list[int] = []
            until = time.perf_counter() + args.seconds
            threads = [threading.Thread(target=client, args=(url, n + 1, until, latencies,
                                                             slots))
                       for n in range(args.sequences)]
            wall = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            wall = time.perf_counter() - wall
            inferences, executions = stats(server)
        finally:
            server.stop()
    lat = np.array(latencies) * 1e3
    print(f"direct sequences={args.sequences} slots={args.slots}: "
          f"{len(lat) / wall:8.0f} infer/s  p50 {np.percentile(lat, 50):7.3f} ms  "
          f"p99 {np.percentile(lat, 99):7.3f} ms  "
          f"{inferences / max(executions, 1):5.2f} requests/execute  "
          f"{max(slots) / max(executions, 1):5.2f} slots/execute", flush=True)


if __name__ == "__main__":
    main()
