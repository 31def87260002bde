"""How fast a client's leaving reaches the model: p50/p99 from leave to is_cancelled().

For each path, a request runs on the ``slow`` test model (which polls ``is_cancelled()``
every 1 ms and records the moment it sees it, on the shared CLOCK_MONOTONIC); the client
leaves once the model has started, and the delay is the model's timestamp minus the
client's. Run idle, then again while other clients keep the server busy.

    python bench/cancellation.py [--trials 50] [--instance-kind thread|process]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import socket
import struct
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.e2e.observe import Records
from tests.server_process import TritiumProcess
from tests.zoo import DECOUPLED, _parameter, _tensor, add_model

Leave = Callable[[TritiumProcess, str], float]


def build(repo: Path, records: Path) -> None:
    tensors = _tensor("input", "INPUT0", "FP32", "1") + _tensor("output", "OUTPUT0", "FP32", "1")
    record = _parameter("record_file", str(records))
    add_model(repo, "slow", "slow", tensors + record + "instance_group [{ count: 2 }]\n")
    add_model(repo, "slow_decoupled", "slow",
              DECOUPLED + tensors + record + "instance_group [{ count: 2 }]\n")
    add_model(repo, "identity", "identity",
              "max_batch_size: 8\n" + _tensor("input", "INPUT0", "FP32", "-1")
              + _tensor("output", "OUTPUT0", "FP32", "-1") + "instance_group [{ count: 2 }]\n")


def http_leave(model: str, endpoint: str, records: Records) -> Leave:
    def leave(server: TritiumProcess, rid: str) -> float:
        if endpoint == "infer":
            body = json.dumps({"id": rid, "inputs": [
                {"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [30]}]}).encode()
        else:
            body = json.dumps({"id": rid, "INPUT0": 30}).encode()
        sock = socket.create_connection(("127.0.0.1", server.http_port))
        sock.sendall(f"POST /v2/models/{model}/{endpoint} HTTP/1.1\r\nHost: b\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        records.wait_for(rid, "start")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        left = time.monotonic()
        sock.close()
        return left
    return leave


def grpc_unary_leave(records: Records) -> Leave:
    import tritonclient.grpc as grpcclient

    def leave(server: TritiumProcess, rid: str) -> float:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
        tensor.set_data_from_numpy(np.array([30], dtype=np.float32))
        call = client.async_infer("slow", [tensor], callback=lambda *_, **__: None, request_id=rid)
        records.wait_for(rid, "start")
        left = time.monotonic()
        call.cancel()
        client.close()
        return left
    return leave


def grpc_stream_leave(records: Records) -> Leave:
    import tritonclient.grpc as grpcclient

    def leave(server: TritiumProcess, rid: str) -> float:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        client.start_stream(callback=lambda *_, **__: None)
        tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
        tensor.set_data_from_numpy(np.array([30], dtype=np.float32))
        client.async_stream_infer("slow_decoupled", [tensor], request_id=rid)
        records.wait_for(rid, "start")
        left = time.monotonic()
        client.stop_stream(cancel_requests=True)
        client.close()
        return left
    return leave


def observed(records: Records, rid: str) -> float:
    records.wait_for(rid, "cancelled", timeout=10)
    lines = records.path.read_text().splitlines()
    return next(r["t"] for r in map(json.loads, lines)
                if r["id"] == rid and r["event"] == "cancelled")


def load(port: int, stop_at: float) -> None:
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32",
                                   "data": [0.0] * 16}]}).encode()
    request = (b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: b\r\nContent-Length: %d"
               b"\r\n\r\n%s" % (len(body), body))
    sock = socket.create_connection(("127.0.0.1", port))
    while time.monotonic() < stop_at:
        sock.sendall(request)
        reply = b""
        while b"OUTPUT0" not in reply:
            reply += sock.recv(65536)
    sock.close()


def measure(server: TritiumProcess, records: Records, leave: Leave, trials: int) -> str:
    delays = []
    for _ in range(trials):
        rid = uuid.uuid4().hex[:12]
        left = leave(server, rid)
        delays.append((observed(records, rid) - left) * 1e3)
    return f"p50 {np.percentile(delays, 50):6.2f} ms  p99 {np.percentile(delays, 99):6.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--instance-kind", choices=("thread", "process"), default="thread",
                        help="where the models' instances run (--python-instance-kind)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo, record_file = Path(tmp) / "repo", Path(tmp) / "slow.jsonl"
        build(repo, record_file)
        records = Records(record_file)
        server = TritiumProcess(repo, "--python-instance-kind", args.instance_kind).start()
        paths: dict[str, Leave] = {
            "HTTP /infer": http_leave("slow", "infer", records),
            "HTTP /generate": http_leave("slow", "generate", records),
            "HTTP /generate_stream": http_leave("slow", "generate_stream", records),
            "HTTP /generate_stream decoupled": http_leave("slow_decoupled", "generate_stream",
                                                          records),
            "gRPC ModelInfer cancel": grpc_unary_leave(records),
            "gRPC stream cancel decoupled": grpc_stream_leave(records),
        }
        try:
            for condition in ("idle", "loaded"):
                workers: list[multiprocessing.Process] = []
                if condition == "loaded":
                    stop_at = time.monotonic() + 600
                    workers = [multiprocessing.Process(target=load,
                                                       args=(server.http_port, stop_at))
                               for _ in range(4)]
                    for worker in workers:
                        worker.start()
                for name, leave in paths.items():
                    figures = measure(server, records, leave, args.trials)
                    print(f"{args.instance_kind:7s} {condition:6s} {name:34s} {figures}",
                          flush=True)
                for worker in workers:
                    worker.kill()
                    worker.join()
        finally:
            server.stop()


if __name__ == "__main__":
    main()
