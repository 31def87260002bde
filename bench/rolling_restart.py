"""Requests lost in a rolling restart: two replicas behind HAProxy (deploy/haproxy/tritium.cfg,
health checks on /v2/health/ready), client threads sending inferences through it in a loop;
one replica gets SIGTERM, is started again on the same ports once it has exited, then the
other. Prints requests sent and failed (goal: 0 failed), and what the failures were.

    python bench/rolling_restart.py [--seconds 20] [--http-clients 3] [--grpc-clients 1]
                                    [--lame-duck-secs S]   # passed to the replicas if given
                                    [--without-retries]    # HAProxy's retry-on line removed
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.e2e.proxies import HAProxy, build_replica_repository, free_port
from tests.server_process import TritiumProcess

BODY = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}]}


class Tally:
    """Requests sent and failed, and each failure's description, from every client thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent = collections.Counter[str]()
        self.failed = collections.Counter[str]()
        self.reasons = collections.Counter[str]()

    def count(self, protocol: str, failure: str | None) -> None:
        with self.lock:
            self.sent[protocol] += 1
            if failure is not None:
                self.failed[protocol] += 1
                self.reasons[f"{protocol}: {failure[:120]}"] += 1


def http_client(url: str, tally: Tally, stop: threading.Event) -> None:
    with requests.Session() as session:
        while not stop.is_set():
            try:
                reply = session.post(f"http://{url}/v2/models/identity/infer", json=BODY,
                                     timeout=30)
                tally.count("HTTP", None if reply.status_code == 200
                            else f"{reply.status_code} {reply.text}")
            except requests.RequestException as exc:
                tally.count("HTTP", type(exc).__name__)


def grpc_client(url: str, tally: Tally, stop: threading.Event) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    tensor = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
    with grpcclient.InferenceServerClient(url) as client:
        while not stop.is_set():
            try:
                client.infer("identity", [tensor], client_timeout=30)
                tally.count("gRPC", None)
            except InferenceServerException as exc:
                tally.count("gRPC", f"{exc.status()} {exc.message()}")


class Replica:
    """A tritium replica on ports of its own, which a restart keeps."""

    def __init__(self, repo: Path, extra: list[str]):
        self.repo = repo
        self.args = ["--http-port", str(free_port()), "--grpc-port", str(free_port()),
                     "--metrics-port", str(free_port()), *extra]
        self.process = TritiumProcess(repo, *self.args).start()

    def restart(self) -> tuple[float, float]:
        """SIGTERM, wait for exit 0, start again; returns (seconds to exit, to ready)."""
        began = time.monotonic()
        code = self.process.stop(timeout=120)
        assert code == 0, self.process.log()
        exited = time.monotonic()
        self.process = TritiumProcess(self.repo, *self.args).start()
        return exited - began, time.monotonic() - exited


def wait_up(haproxy: HAProxy, server: str, after: int, timeout: float = 30) -> None:
    """HAProxy logged ``server`` UP again (its health checks passed) after log offset ``after``."""
    deadline = time.monotonic() + timeout
    while f"tritium_http/{server} is UP" not in haproxy.log()[after:]:
        assert time.monotonic() < deadline, haproxy.log()
        time.sleep(0.05)


def without_retries(config: str) -> str:
    line = "    retry-on conn-failure empty-response 503\n"
    assert line in config
    return config.replace(line, "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--http-clients", type=int, default=3)
    parser.add_argument("--grpc-clients", type=int, default=1)
    parser.add_argument("--lame-duck-secs", type=float, default=None)
    parser.add_argument("--without-retries", action="store_true",
                        help="remove retry-on from HAProxy's configuration: the lame duck alone")
    args = parser.parse_args()
    extra = [] if args.lame_duck_secs is None else ["--lame-duck-secs", str(args.lame_duck_secs)]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        repo = build_replica_repository(root / "repo", root)
        replicas = [Replica(repo, extra) for _ in range(2)]
        haproxy = HAProxy(root / "haproxy", [r.process for r in replicas],
                          edit=without_retries if args.without_retries else None).start()
        tally, stop = Tally(), threading.Event()
        clients = ([threading.Thread(target=http_client, args=(haproxy.http_url, tally, stop))
                    for _ in range(args.http_clients)]
                   + [threading.Thread(target=grpc_client, args=(haproxy.grpc_url, tally, stop))
                      for _ in range(args.grpc_clients)])
        started = time.monotonic()
        try:
            for client in clients:
                client.start()
            time.sleep(2)
            for number, replica in enumerate(replicas, start=1):
                offset = len(haproxy.log())
                down, up = replica.restart()
                wait_up(haproxy, f"replica{number}", offset)
                print(f"replica{number}: exited {down:.1f} s after SIGTERM, ready again "
                      f"{up:.1f} s later, back in HAProxy's rotation "
                      f"{time.monotonic() - started:.1f} s into the run", flush=True)
            time.sleep(max(args.seconds - (time.monotonic() - started), 1))
        finally:
            stop.set()
            for client in clients:
                client.join(60)
            haproxy.stop()
            for replica in replicas:
                replica.process.stop()
        elapsed = time.monotonic() - started
        for protocol in sorted(tally.sent):
            print(f"{protocol:5s} requests sent {tally.sent[protocol]:6d}  failed "
                  f"{tally.failed[protocol]:4d}  in {elapsed:.1f} s, "
                  f"{args.http_clients if protocol == 'HTTP' else args.grpc_clients} client(s)")
        for reason, count in tally.reasons.most_common():
            print(f"  {count:4d} x {reason}")


if __name__ == "__main__":
    main()
