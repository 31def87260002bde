"""Steady inference load through a proxy, and replicas that a restart keeps on their ports:
what a rolling restart is measured and tested with."""

from __future__ import annotations

import collections
import signal
import threading
import time
from pathlib import Path
from types import TracebackType

import numpy as np
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.e2e.proxies import HAProxy, Proxy, free_port
from tests.server_process import TritiumProcess

BODY = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}]}


class Tally:
    """Requests sent and failed per protocol, and each failure's text, from every client."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent: collections.Counter[str] = collections.Counter()
        self.failed: collections.Counter[str] = collections.Counter()
        self.reasons: collections.Counter[str] = collections.Counter()

    def count(self, protocol: str, failure: str | None) -> None:
        with self.lock:
            self.sent[protocol] += 1
            if failure is not None:
                self.failed[protocol] += 1
                self.reasons[f"{protocol}: {failure[:120]}"] += 1


def http_client(url: str, tally: Tally, stop: threading.Event) -> None:
    """/infer on identity in a loop, on one keep-alive session (reconnecting when told)."""
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
    """ModelInfer on identity in a loop, on one channel."""
    tensor = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
    with grpcclient.InferenceServerClient(url) as client:
        while not stop.is_set():
            try:
                client.infer("identity", [tensor], client_timeout=30)
                tally.count("gRPC", None)
            except InferenceServerException as exc:
                tally.count("gRPC", f"{exc.status()} {exc.message()}")


class SteadyLoad:
    """Client threads sending through ``proxy`` from entry until exit; ``tally`` counts."""

    def __init__(self, proxy: Proxy, http_clients: int, grpc_clients: int):
        self.tally, self.stop = Tally(), threading.Event()
        self.threads = (
            [threading.Thread(target=http_client, args=(proxy.http_url, self.tally, self.stop))
             for _ in range(http_clients)]
            + [threading.Thread(target=grpc_client, args=(proxy.grpc_url, self.tally, self.stop))
               for _ in range(grpc_clients)])

    def __enter__(self) -> SteadyLoad:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)


class Replica:
    """A tritium replica on ports of its own, which a restart keeps (as a pod keeps its
    address behind a Service, or a host its port behind a proxy)."""

    def __init__(self, repo: Path, *extra: str):
        self.repo = repo
        self.args = ["--http-port", str(free_port()), "--grpc-port", str(free_port()),
                     "--metrics-port", str(free_port()), *extra]
        self.process = TritiumProcess(repo, *self.args).start()

    def restart(self) -> tuple[float, float]:
        """SIGTERM, wait for exit 0, start again; returns (seconds to exit, then to ready)."""
        began = time.monotonic()
        code = self.process.stop(timeout=120)
        assert code == 0, self.process.log()
        exited = time.monotonic()
        self.process = TritiumProcess(self.repo, *self.args).start()
        return exited - began, time.monotonic() - exited


    def stop(self) -> int:
        """SIGINT: the drain without the lame duck, for the end of a run; the exit code."""
        proc = self.process.proc
        if proc is not None and proc.poll() is None:
            self.process.signal(signal.SIGINT)
        return self.process.wait(60)


def wait_up(haproxy: HAProxy, server: str, after: int, timeout: float = 30) -> None:
    """HAProxy logged ``server`` UP (its health checks passed) after log offset ``after``."""
    deadline = time.monotonic() + timeout
    while f"tritium_http/{server} is UP" not in haproxy.log()[after:]:
        assert time.monotonic() < deadline, haproxy.log()
        time.sleep(0.05)
