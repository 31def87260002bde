"""Soak: many requests abandoned at random moments on every path; nothing may leak.

Sends ``--requests`` requests spread over HTTP /infer, /generate, /generate_stream
(plain and decoupled models) and gRPC unary and streaming; each client leaves after a
random delay (before, during or after the model's work). Afterwards the server must
report 0 pending requests, its thread count must be back where it was when idle, its RSS
must have grown by less than 10 MiB, and a normal request must still succeed.

    python bench/soak.py [--requests 10000] [--clients 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import contextlib

from tests.e2e.observe import metric
from tests.server_process import TritiumProcess
from tests.zoo import DECOUPLED, _parameter, _tensor, add_model

HTTP_PATHS = (("slow", "infer"), ("slow", "generate"), ("slow", "generate_stream"),
              ("slow_decoupled", "generate"), ("slow_decoupled", "generate_stream"))


def build(repo: Path, records: Path) -> None:
    tensors = _tensor("input", "INPUT0", "FP32", "1") + _tensor("output", "OUTPUT0", "FP32", "1")
    record = _parameter("record_file", str(records))
    groups = "instance_group [{ count: 2 }]\n"
    add_model(repo, "slow", "slow", tensors + record + groups)
    add_model(repo, "slow_decoupled", "slow", DECOUPLED + tensors + record + groups)


def proc_status(pid: int) -> dict[str, int]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text()
                  .splitlines())
    return {"threads": int(fields["Threads"]), "rss_kib": int(fields["VmRSS"].split()[0])}


async def http_abandon(port: int, model: str, endpoint: str, seconds: float, wait: float) -> None:
    if endpoint == "infer":
        body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32",
                                       "data": [seconds]}]}).encode()
    else:
        body = json.dumps({"INPUT0": seconds}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"POST /v2/models/{model}/{endpoint} HTTP/1.1\r\nHost: s\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(reader.read(1 << 16), wait)
    sock = writer.get_extra_info("socket")
    if random.random() < 0.5 and sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()


async def grpc_abandon(client: object, model: str, seconds: float, wait: float) -> None:
    import tritonclient.grpc.aio as grpcclient

    tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([seconds], dtype=np.float32))
    if model == "slow":
        call = client.infer(model, [tensor])  # type: ignore[attr-defined]
        task = asyncio.ensure_future(call)
    else:
        async def requests_once():  # type: ignore[no-untyped-def]
            yield {"model_name": model, "inputs": [tensor]}

        async def consume() -> None:
            async for _ in client.stream_infer(requests_once()):  # type: ignore[attr-defined]
                pass

        task = asyncio.ensure_future(consume())
    with contextlib.suppress(Exception):
        await asyncio.wait_for(asyncio.shield(task), wait)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def soak(server: TritiumProcess, total: int, clients: int) -> None:
    import tritonclient.grpc.aio as grpcclient

    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(total):
        queue.put_nowait(index)

    async def worker() -> None:
        while not queue.empty():
            index = queue.get_nowait()
            seconds, wait = random.uniform(0, 0.05), random.uniform(0, 0.06)
            if index % 7 < 5:
                model, endpoint = HTTP_PATHS[index % 7]
                await http_abandon(server.http_port, model, endpoint, seconds, wait)
            else:
                await grpc_abandon(grpc, "slow" if index % 7 == 5 else "slow_decoupled",
                                   seconds, wait)
            if index and index % 1000 == 0:
                print(f"  {index} requests sent", flush=True)

    await asyncio.gather(*(worker() for _ in range(clients)))
    await grpc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=10000)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        build(repo, Path(tmp) / "records.jsonl")
        server = TritiumProcess(repo).start()
        try:
            asyncio.run(soak(server, 200, args.clients))  # warm up every path once
            time.sleep(1)
            before = proc_status(server.pid)
            started = time.monotonic()
            asyncio.run(soak(server, args.requests, args.clients))
            elapsed = time.monotonic() - started
            deadline = time.monotonic() + 30
            pending = -1.0
            while time.monotonic() < deadline:
                pending = sum(metric(server.metrics_url, "nv_inference_pending_request_count",
                                     model=m) for m in ("slow", "slow_decoupled"))
                after = proc_status(server.pid)
                if pending == 0 and after["threads"] <= before["threads"]:
                    break
                time.sleep(0.2)
            after = proc_status(server.pid)
            body = {"INPUT0": 0.001}
            ok = requests.post(f"http://{server.http_url}/v2/models/slow/generate", json=body,
                               timeout=30).status_code == 200
            growth = (after["rss_kib"] - before["rss_kib"]) / 1024
            print(f"soak: {args.requests} abandoned requests in {elapsed:.1f} s; pending "
                  f"{pending:.0f}; threads {before['threads']} -> {after['threads']}; "
                  f"RSS +{growth:.1f} MiB; normal request ok: {ok}")
            passed = pending == 0 and after["threads"] <= before["threads"] and growth < 10 and ok
            print("soak PASSED" if passed else "soak FAILED")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
