"""Ways a client leaves a request, one abstraction over HTTP and gRPC, and what tests observe."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import requests

from tests.e2e.observe import Records, metric, wait_for_metric
from tests.server_process import TritiumProcess

PENDING = "nv_inference_pending_request_count"
CANCELLED = "tritium_inference_cancellation"
# How long a model may keep working after its client left; generous for a busy CI machine.
STOP_BOUND_S = 1.0
# Long enough that only a cancel ends the work, short enough that a leak ends by itself.
WORK_S = 30.0
# A client deadline that a request on an idle instance starts well within.
DEADLINE_S = 1.5
# The server's log text for each reason label of the cancellation metric.
REASON_TEXT = {
    "CLIENT_DISCONNECTED": "client disconnected",
    "CLIENT_CANCELLED": "client cancelled",
    "DEADLINE": "deadline exceeded",
    "PARENT_CANCELLED": "parent request cancelled",
}
# Instances per model, so that a test can keep all of them busy; 1 unless listed.
INSTANCES = {"slow_pair": 2}
# The file each recording model appends its observations to (see tests/models/slow.py).
RECORD_FILES = {"slow": "slow.jsonl", "slow_decoupled": "slow.jsonl",
                "slow_pair": "slow_pair.jsonl", "slow_child": "slow_child.jsonl"}

Inputs = dict[str, float | str]


def new_id() -> str:
    return "c" + uuid.uuid4().hex[:12]


def inputs_for(model: str, seconds: float) -> Inputs:
    """What ``model`` needs to work for ``seconds``; bls passes them on to slow_child."""
    if model == "bls":
        return {"MODE": "slow", "INPUT0": seconds}
    return {"INPUT0": seconds}


def records_for(record_dir: Path, model: str) -> Records:
    return Records(record_dir / RECORD_FILES[model])


class Sent:
    """One request in flight on some client, which the test then abandons."""

    def leave(self) -> float:
        """Leave the request; returns when (CLOCK_MONOTONIC) it left or its deadline ran out."""
        raise NotImplementedError

    def answered(self) -> None:
        """Wait until the whole answer arrived (ways with ``finishable`` only)."""
        raise NotImplementedError

    def check_client(self) -> None:
        """Assert what the client itself saw of its leaving, where the way promises something."""

    def close(self) -> None:
        """Release what is left of the client; safe to call more than once."""


@dataclass(frozen=True)
class Way:
    """How a client leaves: protocol, route, model, and the action, with what it must cause."""

    protocol: str
    route: str
    model: str
    how: str
    reason: str
    send: Callable[[Way, TritiumProcess, str, Inputs], Sent]
    deadline_s: float | None = None
    finishable: bool = False

    @property
    def id(self) -> str:
        return f"{self.protocol}-{self.route}-{self.model}-{self.how}"

    def start(self, server: TritiumProcess, request_id: str, seconds: float = WORK_S) -> Sent:
        return self.send(self, server, request_id, inputs_for(self.model, seconds))


def cancel_line(request_id: str, model: str, stage: str) -> str:
    return f"request {request_id} for model '{model}' version 1 cancelled while {stage}"


def cancellations(server: TritiumProcess, model: str, reason: str, stage: str) -> float:
    return metric(server.metrics_url, CANCELLED, model=model, reason=reason, stage=stage)


def wait_for_cancellations(server: TritiumProcess, model: str, reason: str, stage: str,
                           value: float) -> None:
    wait_for_metric(server.metrics_url, CANCELLED, value, model=model, reason=reason,
                    stage=stage)


def assert_stopped_soon(records: Records, request_id: str, left_at: float) -> None:
    stopped = records.wait_for(request_id, "cancelled")
    assert stopped - left_at < STOP_BOUND_S, f"model stopped {stopped - left_at:.3f} s late"
    assert "done" not in records.events(request_id)


def post(server: TritiumProcess, model: str, endpoint: str, body: bytes) -> requests.Response:
    return requests.post(f"http://{server.http_url}/v2/models/{model}/{endpoint}", data=body,
                         timeout=60)


def run_marker(server: TritiumProcess, records: Records, model: str) -> None:
    """A short request through ``model``, answered and recorded in full: whatever was queued
    before it on the instance has run or been removed by then."""
    marker = new_id()
    body = f'{{"id": "{marker}", "INPUT0": 0.01}}'.encode()
    assert post(server, model, "generate_stream", body).status_code == 200
    assert records.events(marker) == ["start", "done"]


def http_raw_request(model: str, endpoint: str, body: bytes) -> bytes:
    return (f"POST /v2/models/{model}/{endpoint} HTTP/1.1\r\nHost: t\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode() + body


@contextmanager
def occupied(server: TritiumProcess, records: Records, model: str) -> Iterator[None]:
    """Every instance of ``model`` busy with another client's request, so the next one queues.

    The holders leave by closing their connections; their cancels are logged before this
    returns, so a later test's count of cancellations starts from a settled value."""
    holders: list[tuple[str, socket.socket]] = []
    try:
        for _ in range(INSTANCES.get(model, 1)):
            holder = new_id()
            sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
            holders.append((holder, sock))
            body = f'{{"id": "{holder}", "INPUT0": {WORK_S}}}'.encode()
            sock.sendall(http_raw_request(model, "generate", body))
            records.wait_for(holder, "start")
        yield
    finally:
        for _, sock in holders:
            sock.close()
        for holder, _ in holders:
            records.wait_for(holder, "cancelled")
            server.wait_for_line(cancel_line(holder, model, "executing"))

