"""What a proxy adds to a cancel: p50/p99 delay from a client leaving to the model seeing
``is_cancelled()``, straight to a replica, through nginx and through HAProxy.

Two replicas run behind each proxy, on the configurations shipped in deploy/ (see
tests/e2e/proxies.py). Each try starts a request on the ``slow`` test model (which polls
``is_cancelled()`` every 1 ms and records when it sees it, on the shared CLOCK_MONOTONIC), waits
until the model has started, then leaves: HTTP closes its socket, gRPC cancels the call. The
delay is the model's timestamp minus the client's. Needs nginx and haproxy installed.

    python bench/proxies.py [--trials 50]
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.e2e.observe import Records
from tests.e2e.proxies import HAProxy, Nginx, build_replica_repository
from tests.server_process import TritiumProcess

# host:port of HTTP, host:port of gRPC: a replica or a proxy in front of both.
Target = tuple[str, str]
Leave = Callable[[Target, str], float]
WORK_S = 30


def http_leave(route: str, model: str, records: Records) -> Leave:
    def leave(target: Target, rid: str) -> float:
        if route == "infer":
            body = json.dumps({"id": rid, "inputs": [
                {"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [WORK_S]}]})
        else:
            body = json.dumps({"id": rid, "INPUT0": WORK_S})
        host, port = target[0].split(":")
        sock = socket.create_connection((host, int(port)))
        sock.sendall(f"POST /v2/models/{model}/{route} HTTP/1.1\r\nHost: b\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
        records.wait_for(rid, "start")
        left = time.monotonic()
        sock.close()
        return left
    return leave


def grpc_leave(stream: bool, records: Records) -> Leave:
    import tritonclient.grpc as grpcclient

    def leave(target: Target, rid: str) -> float:
        client = grpcclient.InferenceServerClient(target[1])
        tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
        tensor.set_data_from_numpy(np.array([WORK_S], dtype=np.float32))
        if stream:
            client.start_stream(callback=lambda *_, **__: None)
            client.async_stream_infer("slow_decoupled", [tensor], request_id=rid)
        else:
            call = client.async_infer("slow", [tensor], callback=lambda *_, **__: None,
                                      request_id=rid)
        records.wait_for(rid, "start")
        left = time.monotonic()
        if stream:
            client.stop_stream(cancel_requests=True)
        else:
            call.cancel()
        client.close()
        return left
    return leave


def measure(targets: dict[str, Target], records: Records, leave: Leave, trials: int
            ) -> dict[str, list[float]]:
    """Delays in ms per target; the targets take turns, so a busy spell of the machine
    weighs on each of them alike."""
    delays: dict[str, list[float]] = {via: [] for via in targets}
    for _ in range(trials):
        for via, target in targets.items():
            rid = uuid.uuid4().hex[:12]
            left = leave(target, rid)
            delays[via].append((records.wait_for(rid, "cancelled") - left) * 1e3)
    return delays


def figures(delays: list[float]) -> str:
    return (f"p50 {np.percentile(delays, 50):6.2f} ms  p99 {np.percentile(delays, 99):6.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        repo = build_replica_repository(root / "repo", root)
        records = Records(root / "slow.jsonl")
        replicas = [TritiumProcess(repo).start() for _ in range(2)]
        proxies = [Nginx(root / "nginx", replicas).start(),
                   HAProxy(root / "haproxy", replicas).start()]
        targets: dict[str, Target] = {"direct": (replicas[0].http_url, replicas[0].grpc_url)}
        targets.update({proxy.name: (proxy.http_url, proxy.grpc_url) for proxy in proxies})
        paths: dict[str, Leave] = {
            "HTTP /infer close": http_leave("infer", "slow", records),
            "HTTP /generate_stream decoupled close": http_leave("generate_stream",
                                                                "slow_decoupled", records),
            "gRPC ModelInfer cancel": grpc_leave(False, records),
            "gRPC ModelStreamInfer cancel": grpc_leave(True, records),
        }
        try:
            for name, leave in paths.items():
                delays = measure(targets, records, leave, args.trials)
                direct = float(np.percentile(delays["direct"], 50))
                for via, measured in delays.items():
                    p50 = float(np.percentile(measured, 50))
                    added = "" if via == "direct" else f"  ({p50 - direct:+.2f} ms p50)"
                    print(f"{name:38s} {via:8s} {figures(measured)}{added}", flush=True)
        finally:
            for proxy in proxies:
                proxy.stop()
            for replica in replicas:
                replica.stop()


if __name__ == "__main__":
    main()
