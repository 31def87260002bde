"""Cancellation only HTTP has: a request pipelined behind one that is cancelled never runs."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from tests.e2e.leaving import (
    WORK_S,
    assert_stopped_soon,
    cancel_line,
    http_raw_request,
    inputs_for,
    new_id,
    records_for,
    run_marker,
)
from tests.e2e.leaving_http import body, close
from tests.server_process import TritiumProcess


def request(model: str, endpoint: str, request_id: str, seconds: float) -> bytes:
    return http_raw_request(model, endpoint, body(endpoint, request_id, inputs_for(model, seconds)))


@pytest.mark.parametrize("reset", [False, True], ids=["fin", "rst"])
@pytest.mark.parametrize(("model", "endpoint"), [("slow", "infer"),
                                               ("slow_decoupled", "generate_stream")])
def test_pipelined_request_behind_another_never_runs(server: TritiumProcess, record_dir: Path,
                                                      model: str, endpoint: str,
                                                      reset: bool) -> None:
    records = records_for(record_dir, model)
    first, second = new_id(), new_id()
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
    sock.sendall(request(model, endpoint, first, WORK_S) + request(model, endpoint, second, 0))
    records.wait_for(first, "start")
    left_at = time.monotonic()
    close(sock, reset)
    assert_stopped_soon(records, first, left_at)
    server.wait_for_line(cancel_line(first, model, "executing"))
    # The next request runs on the freed instance; a leaked pipelined one would run first.
    run_marker(server, records, model)
    assert records.events(second) == []
