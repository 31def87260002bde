"""gRPC identity inference: infer/s, p50/p99 latency and server CPU µs per inference.

Starts ``tritium serve`` on the bundled example repository and drives its ``identity`` model
([1,16] FP32) with ModelInfer calls from one grpc.aio process. The request is serialized
once and responses are left unparsed (bytes in, bytes out), so the 2-core machine's CPU goes
to the server; the server's own CPU time is read from /proc before and after each run.

    python bench/grpc_infer.py [--seconds 5] [--concurrency 1 4 16]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.server_process import TritiumProcess

REPOSITORY = Path(__file__).resolve().parent.parent / "src" / "tritium" / "example_repository"
METHOD = "/inference.GRPCInferenceService/ModelInfer"


def request_bytes(model: str, elements: int) -> bytes:
    message = pb.ModelInferRequest(model_name=model)
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, elements])
    message.raw_input_contents.append(np.arange(elements, dtype=np.float32).tobytes())
    return message.SerializeToString()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def client(call: grpc.aio.UnaryUnaryMultiCallable, payload: bytes, stop_at: float,
                 latencies: list[float]) -> None:
    while time.perf_counter() < stop_at:
        started = time.perf_counter()
        await call(payload)
        latencies.append(time.perf_counter() - started)


async def run(url: str, payload: bytes, concurrency: int, seconds: float) -> list[float]:
    latencies: list[float] = []
    async with grpc.aio.insecure_channel(url) as channel:
        call = channel.unary_unary(METHOD)  # no serializers: bytes both ways
        reply = pb.ModelInferResponse.FromString(await call(payload))
        assert reply.outputs[0].name == "OUTPUT0", reply
        stop_at = time.perf_counter() + seconds
        await asyncio.gather(*(client(call, payload, stop_at, latencies)
                               for _ in range(concurrency)))
    return latencies


def measure(server: TritiumProcess, payload: bytes, concurrency: int, seconds: float) -> str:
    import uvloop

    uvloop.run(run(server.grpc_url, payload, concurrency, 0.5))  # warm up
    cpu_before = cpu_seconds(server.pid)
    wall = time.perf_counter()
    latencies = uvloop.run(run(server.grpc_url, payload, concurrency, seconds))
    wall = time.perf_counter() - wall
    cpu = cpu_seconds(server.pid) - cpu_before
    lat = np.array(latencies) * 1e3
    return (f"grpc  c={concurrency:<3d} {len(lat) / wall:9.0f} infer/s  "
            f"p50 {np.percentile(lat, 50):7.3f} ms  p99 {np.percentile(lat, 99):7.3f} ms  "
            f"server CPU {cpu / len(lat) * 1e6:6.1f} µs/infer")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--elements", type=int, default=16)
    args = parser.parse_args()
    server = TritiumProcess(REPOSITORY).start()
    try:
        payload = request_bytes("identity", args.elements)
        for concurrency in args.concurrency:
            print(measure(server, payload, concurrency, args.seconds), flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
