"""Cancellation only gRPC has: multi-request streams, half-close, a deadline outliving answers."""

from __future__ import annotations

import queue
import time
from pathlib import Path
from typing import Any

import tritonclient.grpc as grpcclient

from tests.e2e.leaving import (
    DEADLINE_S,
    Way,
    assert_stopped_soon,
    cancel_line,
    cancellations,
    new_id,
    records_for,
    run_marker,
    wait_for_cancellations,
)
from tests.e2e.leaving_grpc import StubSent, client_inputs
from tests.server_process import TritiumProcess


def test_stream_cancel_cancels_every_request(server: TritiumProcess, record_dir: Path) -> None:
    pair = records_for(record_dir, "slow_pair")  # two instances: both requests run at once
    ids = [new_id(), new_id()]
    results: queue.Queue[Any] = queue.Queue()
    before = cancellations(server, "slow_pair", "CLIENT_CANCELLED", "executing")
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(lambda result, error: results.put((result, error)))
        for rid in ids:
            client.async_stream_infer("slow_pair", client_inputs({"INPUT0": 5.0}),
                                      request_id=rid)
        for rid in ids:
            pair.wait_for(rid, "start")
        left_at = time.monotonic()
        client.stop_stream(cancel_requests=True)
    for rid in ids:
        assert_stopped_soon(pair, rid, left_at)
        server.wait_for_line(cancel_line(rid, "slow_pair", "executing"))
    wait_for_cancellations(server, "slow_pair", "CLIENT_CANCELLED", "executing", before + 2)
    assert all(result is None for result, _ in list(results.queue))


def test_stream_half_close_cancels_nothing(server: TritiumProcess, record_dir: Path) -> None:
    pair = records_for(record_dir, "slow_pair")
    rid = new_id()
    results: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(lambda result, error: results.put((result, error)))
        client.async_stream_infer("slow_pair", client_inputs({"INPUT0": 0.3}), request_id=rid)
        pair.wait_for(rid, "start")
        client.stop_stream()  # half-close while the request runs: it must still answer
    result, error = results.get_nowait()
    assert error is None and result.get_response().id == rid
    assert pair.times(rid, "done") and not pair.times(rid, "cancelled")
    assert f"request {rid} " not in server.log()


def test_stream_deadline_after_its_answers_cancels_nothing(server: TritiumProcess,
                                                          record_dir: Path) -> None:
    records = records_for(record_dir, "slow")
    way = Way("grpc", "stream", "slow", "deadline", "DEADLINE", StubSent, deadline_s=DEADLINE_S)
    rid = new_id()
    sent = way.start(server, rid, seconds=0.01)
    try:
        sent.answered()
        sent.check_client()  # the open stream itself ends with DEADLINE_EXCEEDED
    finally:
        sent.close()
    run_marker(server, records, "slow")
    assert records.events(rid) == ["start", "done"]
    assert f"request {rid} " not in server.log()
