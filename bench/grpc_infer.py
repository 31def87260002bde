"""gRPC identity inference: infer/s, p50/p99 latency and server CPU µs per inference.

Starts ``tritium serve`` on the bundled example repository and drives its ``identity`` model
([1,16] FP32) with ModelInfer calls from one grpc.aio process. The request is serialized
once and responses are left unparsed (bytes in, bytes out), so the 2-core machine's CPU goes
to the server; the server's own CPU time is read from /proc before and after each run.

    python bench/grpc_infer.py [--seconds 5] [--concurrency 1 4 16]
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb

sys.path.insert(0, str(Path(__file__).resolve().parent))
from driver import Run, main

METHOD = "/inference.GRPCInferenceService/ModelInfer"


def request_bytes(model: str, elements: int) -> bytes:
    message = pb.ModelInferRequest(model_name=model)
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, elements])
    message.raw_input_contents.append(np.arange(elements, dtype=np.float32).tobytes())
    return message.SerializeToString()


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


def make_run(elements: int) -> Run:
    payload = request_bytes("identity", elements)
    return lambda server, concurrency, seconds: run(server.grpc_url, payload, concurrency,
                                                    seconds)


if __name__ == "__main__":
    main("grpc", __doc__, make_run)
