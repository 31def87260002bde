"""Calls/s and server CPU per call of the bare gRPC transport, beside grpc.aio's server.

Usage: PYTHONPATH=src python bench/grpc_transport.py [--seconds 5] [--concurrency 1 16]

Each server runs in a child process under uvloop and answers ModelInfer with a prebuilt
identity response ([1,16] FP32) without touching a model: once on tritium's own HTTP/2
transport, once on a grpc.aio server with a generic bytes handler. The client is one grpc.aio
channel in this process. Server CPU comes from /proc/<pid>/stat.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import uvloop
from tritonclient.grpc import service_pb2 as pb

sys.path.insert(0, str(Path(__file__).resolve().parent))
from http_transport import cpu_seconds

METHOD = "/inference.GRPCInferenceService/ModelInfer"


def reply() -> pb.ModelInferResponse:
    message = pb.ModelInferResponse(model_name="identity", model_version="1")
    message.outputs.add(name="OUTPUT0", datatype="FP32", shape=[1, 16])
    message.raw_output_contents.append(np.zeros(16, np.float32).tobytes())
    return message


async def serve_tritium() -> None:
    from tritium.frontends.grpc.call import Rpc
    from tritium.frontends.grpc.server import start_grpc_server

    answer = reply()

    async def model_infer(request: object, call: object) -> pb.ModelInferResponse:
        return answer

    routes = {METHOD: Rpc(pb.ModelInferRequest, unary=model_infer)}
    server = await start_grpc_server(routes, "127.0.0.1", 0)
    print(server.port, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until closed


async def serve_grpc_aio() -> None:
    answer = reply().SerializeToString()

    async def model_infer(request: bytes, context: object) -> bytes:
        pb.ModelInferRequest.FromString(request)  # as the real servicer would
        return answer

    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(model_infer)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService", {"ModelInfer": handler})])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop(0)


def request_bytes() -> bytes:
    message = pb.ModelInferRequest(model_name="identity")
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
    message.raw_input_contents.append(np.zeros(16, np.float32).tobytes())
    return message.SerializeToString()


async def drive(port: int, pid: int, concurrency: int, seconds: float) -> tuple[float, float]:
    payload = request_bytes()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(METHOD)
        pb.ModelInferResponse.FromString(await call(payload))
        done = 0

        async def client(stop_at: float) -> None:
            nonlocal done
            while time.perf_counter() < stop_at:
                await call(payload)
                done += 1

        before = sum(cpu_seconds(pid))
        started = time.perf_counter()
        await asyncio.gather(*(client(started + seconds) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        used = sum(cpu_seconds(pid)) - before
    return done / elapsed, used / done * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--serve", choices=["tritium", "grpc.aio"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        uvloop.run(serve_tritium() if args.serve == "tritium" else serve_grpc_aio())
        return
    for kind in ("tritium", "grpc.aio"):
        child = subprocess.Popen([sys.executable, __file__, "--serve", kind],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None and child.stdin is not None
        port = int(child.stdout.readline())
        try:
            for concurrency in args.concurrency:
                rate, cpu = asyncio.run(drive(port, child.pid, concurrency, args.seconds))
                print(f"{kind:9} c={concurrency:<3} {rate:8.0f} calls/s   server CPU "
                      f"{cpu:6.1f} µs/call", flush=True)
        finally:
            child.stdin.close()
            child.wait(10)


if __name__ == "__main__":
    main()
