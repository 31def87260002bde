"""A client leaving an ensemble request reaches every step: the queued one is dropped, the
executing one sees is_cancelled(), and no later step ever starts.

Triton's ensemble scheduler only marks a step cancelled when it schedules it (server issue
#6739: a step already queued or running never learns the client left); tritium's steps
follow the ensemble request's cancellation instead, by every way a client leaves.
"""

from __future__ import annotations

import json
import queue
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient

from tests.e2e import leaving_grpc, leaving_http
from tests.e2e.ensemble_zoo import (  # noqa: F401 - fixtures
    PIPELINE,
    PIPELINE_INPUTS,
    STAGES,
    ensemble_records,
    ensemble_server,
)
from tests.e2e.leaving import (
    PENDING,
    REASON_TEXT,
    WORK_S,
    Way,
    assert_stopped_soon,
    cancel_line,
    cancellations,
    http_raw_request,
    new_id,
    occupied,
    wait_for_cancellations,
)
from tests.e2e.observe import Records, metric, wait_for_metric
from tests.server_process import TritiumProcess

FAILURES = "nv_inference_request_failure"
SHORT_S = 0.01
WAYS = [
    leaving_http.way("infer", PIPELINE, "fin"),
    leaving_http.way("generate", PIPELINE, "rst"),
    *leaving_grpc.stub_ways([("unary", PIPELINE)], ("cancel", "deadline")),
    *leaving_grpc.stub_ways([("stream", PIPELINE)], ("cancel",)),
]


def way_id(way: Way) -> str:
    return way.id


def stage_records(record_dir: Path) -> dict[str, Records]:
    return {name: Records(record_dir / f"{name}.jsonl") for name in STAGES}


def pipeline_inputs(slow_stage: str | None = None) -> dict[str, float | str]:
    """Every stage works SHORT_S, except ``slow_stage``, which works until cancelled."""
    return {PIPELINE_INPUTS[name]: WORK_S if name == slow_stage else SHORT_S for name in STAGES}


def run_pipeline_marker(server: TritiumProcess, records: dict[str, Records]) -> None:
    """A whole pipeline request, answered: each stage has one instance and a FIFO queue, so
    anything submitted to a stage before this marker has run (and recorded) by now."""
    marker = new_id()
    body = json.dumps({"id": marker, **pipeline_inputs()}).encode()
    reply = requests.post(f"http://{server.http_url}/v2/models/{PIPELINE}/generate", data=body,
                          timeout=60)
    assert reply.status_code == 200, reply.text
    for name in STAGES:
        assert records[name].events(marker) == ["start", "done"], name


def ensemble_cancelled(server: TritiumProcess) -> float:
    return metric(server.metrics_url, FAILURES, model=PIPELINE, reason="CANCELED")


def assert_only_before(records: dict[str, Records], rid: str, stage: str,
                       stage_events: list[str]) -> None:
    """Stages before ``stage`` ran to completion, ``stage`` saw ``stage_events``, and no
    stage after it ever started."""
    index = STAGES.index(stage)
    for name in STAGES[:index]:
        assert records[name].events(rid) == ["start", "done"], name
    assert records[stage].events(rid) == stage_events
    for name in STAGES[index + 1:]:
        assert records[name].events(rid) == [], name


@pytest.fixture
def records(ensemble_records: Path) -> dict[str, Records]:  # noqa: F811
    return stage_records(ensemble_records)


@pytest.fixture
def server(ensemble_server: TritiumProcess) -> Iterator[TritiumProcess]:  # noqa: F811
    yield ensemble_server


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("way", WAYS, ids=way_id)
def test_leaving_stops_the_executing_step_and_starts_no_later_one(
        server: TritiumProcess, records: dict[str, Records], way: Way, stage: str) -> None:
    rid = new_id()
    before = cancellations(server, stage, way.reason, "executing")
    ensemble_before = ensemble_cancelled(server)
    sent = way.send(way, server, rid, pipeline_inputs(stage))
    try:
        records[stage].wait_for(rid, "start")
        assert_stopped_soon(records[stage], rid, sent.leave())
        # The step was cancelled for the client's own reason, counted on its own model.
        line = server.wait_for_line(cancel_line(rid, stage, "executing"))
        assert line.endswith(f": {REASON_TEXT[way.reason]}"), line
        wait_for_cancellations(server, stage, way.reason, "executing", before + 1)
        wait_for_metric(server.metrics_url, FAILURES, ensemble_before + 1, model=PIPELINE,
                        reason="CANCELED")
        sent.check_client()
    finally:
        sent.close()
    run_pipeline_marker(server, records)
    assert_only_before(records, rid, stage, ["start", "cancelled"])


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("way", WAYS, ids=way_id)
def test_leaving_drops_the_queued_step_and_starts_no_later_one(
        server: TritiumProcess, records: dict[str, Records], way: Way, stage: str) -> None:
    rid = new_id()
    with occupied(server, records[stage], stage):
        before = cancellations(server, stage, way.reason, "queued")
        sent = way.send(way, server, rid, pipeline_inputs())
        try:
            if way.deadline_s is None:  # a deadline may pass before the gauge is read
                wait_for_metric(server.metrics_url, PENDING, 1, model=stage)
            sent.leave()
            line = server.wait_for_line(cancel_line(rid, stage, "queued"))
            assert line.endswith(f": {REASON_TEXT[way.reason]}"), line
            wait_for_metric(server.metrics_url, PENDING, 0, model=stage)
            wait_for_cancellations(server, stage, way.reason, "queued", before + 1)
            sent.check_client()
        finally:
            sent.close()
    run_pipeline_marker(server, records)
    assert_only_before(records, rid, stage, [])


def test_leaving_a_bls_request_reaches_the_ensemble_it_called(
        server: TritiumProcess, records: dict[str, Records]) -> None:
    """bls_to_stage calls the one_stage ensemble from execute(); the client leaving the BLS
    request cancels the BLS child (the ensemble), and through it the ensemble's step."""
    rid = new_id()
    way = leaving_http.way("infer", "bls_to_stage", "fin")
    before = cancellations(server, "stage_1", "PARENT_CANCELLED", "executing")
    sent = way.send(way, server, rid, {"INPUT0": WORK_S})
    try:
        records["stage_1"].wait_for(rid, "start")
        assert_stopped_soon(records["stage_1"], rid, sent.leave())
        wait_for_cancellations(server, "stage_1", "PARENT_CANCELLED", "executing", before + 1)
    finally:
        sent.close()


def test_cancelling_a_streaming_ensemble_stops_its_decoupled_step(
        server: TritiumProcess) -> None:
    """tritonclient's stop_stream(cancel_requests=True) on a decoupled ensemble streaming
    through ModelStreamInfer: its decoupled step (repeat, which checks is_cancelled() before
    each response) is counted cancelled while executing and stops, sending its FINAL: the
    step's request then ends as cancelled, long before its 100000 responses."""
    before = cancellations(server, "repeat", "CLIENT_CANCELLED", "executing")
    repeat_failed = metric(server.metrics_url, FAILURES, model="repeat", reason="CANCELED")
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(lambda result, error: results.put((result, error)))
        client.async_stream_infer("streaming", streaming_inputs(100000, 20.0),
                                  request_id=new_id())
        result, error = results.get(timeout=30)  # tokens are flowing through both steps
        assert error is None and result.as_numpy("OUTPUT0").tolist() == [0]
        client.stop_stream(cancel_requests=True)
        wait_for_cancellations(server, "repeat", "CLIENT_CANCELLED", "executing", before + 1)
        wait_for_metric(server.metrics_url, FAILURES, repeat_failed + 1, model="repeat",
                        reason="CANCELED")
    finally:
        client.close()


def test_leaving_generate_stream_of_a_streaming_ensemble_stops_its_decoupled_step(
        server: TritiumProcess) -> None:
    """The same over HTTP: the client resets its /generate_stream connection after the
    first event; the decoupled step sees is_cancelled() and ends its request."""
    before = cancellations(server, "repeat", "CLIENT_DISCONNECTED", "executing")
    repeat_failed = metric(server.metrics_url, FAILURES, model="repeat", reason="CANCELED")
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
    try:
        body = json.dumps({"id": new_id(), "COUNT": 100000, "DELAY": 20}).encode()
        sock.sendall(http_raw_request("streaming", "generate_stream", body))
        seen = b""
        while b"data: " not in seen:
            chunk = sock.recv(65536)
            assert chunk, seen
            seen += chunk
        assert seen.startswith(b"HTTP/1.1 200"), seen
    finally:
        leaving_http.close(sock, reset=True)
    wait_for_cancellations(server, "repeat", "CLIENT_DISCONNECTED", "executing", before + 1)
    wait_for_metric(server.metrics_url, FAILURES, repeat_failed + 1, model="repeat",
                    reason="CANCELED")


def streaming_inputs(count: int, delay_ms: float) -> list[grpcclient.InferInput]:
    tensors = [grpcclient.InferInput("COUNT", [1], "INT32"),
               grpcclient.InferInput("DELAY", [1], "FP32")]
    tensors[0].set_data_from_numpy(np.array([count], dtype=np.int32))
    tensors[1].set_data_from_numpy(np.array([delay_ms], dtype=np.float32))
    return tensors
