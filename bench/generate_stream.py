"""Responses per second a decoupled model's stream delivers when it sends as fast as it can,
over HTTP /generate_stream (SSE) and gRPC ModelStreamInfer.

Starts ``tritium serve`` on a temporary repository holding the test suite's ``repeat``
model (decoupled, one response per index, no delay). The SSE stream is read with a raw socket,
counting ``data:`` events; the gRPC stream with a grpc.aio channel, leaving responses
unparsed.

    python bench/generate_stream.py [--events 50000] [--streams 1 4]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from driver import cpu_seconds
from tests.server_process import TritiumProcess
from tests.zoo import DECOUPLED, add_model

CONFIG = (DECOUPLED
          + 'input [{ name: "INPUT0" data_type: TYPE_INT32 dims: [1] }, '
          + '{ name: "DELAY" data_type: TYPE_FP32 dims: [1] optional: true }]\n'
          + 'output [{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [1] }]\n'
          + "instance_group [{ count: 4 }]\n")


async def stream(port: int, events: int) -> int:
    body = b'{"INPUT0": %d}' % events
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v2/models/repeat/generate_stream HTTP/1.1\r\nHost: b\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    seen = 0
    tail = b""
    while True:
        chunk = await reader.read(1 << 16)
        if not chunk:
            break
        data = tail + chunk
        seen += data.count(b"data: ")
        tail = data[-8:]
        seen -= tail.count(b"data: ")  # counted again with the next chunk
        if data.endswith(b"0\r\n\r\n"):
            break
    writer.close()
    return seen + tail.count(b"data: ")


async def grpc_stream(url: str, events: int) -> int:
    import grpc
    import numpy as np
    from tritonclient.grpc import service_pb2 as pb

    message = pb.ModelInferRequest(model_name="repeat")
    message.inputs.add(name="INPUT0", datatype="INT32", shape=[1])
    message.raw_input_contents.append(np.array([events], dtype=np.int32).tobytes())
    async with grpc.aio.insecure_channel(url) as channel:
        call = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        seen = 0
        async for _ in call(iter([message.SerializeToString()])):  # bytes in, bytes out
            seen += 1
    return seen


async def run(server: TritiumProcess, protocol: str, events: int, streams: int) -> int:
    one = (lambda: stream(server.http_port, events)) if protocol == "http" else (
        lambda: grpc_stream(server.grpc_url, events))
    counts = await asyncio.gather(*(one() for _ in range(streams)))
    return sum(counts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=50000)
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args()
    import uvloop

    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        add_model(repo, "repeat", "repeat", CONFIG)
        server = TritiumProcess(repo).start()
        try:
            for protocol, label in (("http", "generate_stream"), ("grpc", "ModelStreamInfer")):
                uvloop.run(run(server, protocol, 1000, 1))  # warm up
                for streams in args.streams:
                    cpu = cpu_seconds(server.pid)
                    started = time.perf_counter()
                    total = uvloop.run(run(server, protocol, args.events, streams))
                    wall = time.perf_counter() - started
                    cpu = cpu_seconds(server.pid) - cpu
                    print(f"{label:16s} streams={streams:<2d} {total / wall:9.0f} events/s  "
                          f"server CPU {cpu / total * 1e6:6.1f} µs/event  ({total} events)",
                          flush=True)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
