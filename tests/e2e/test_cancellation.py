"""A client leaving a request cancels it, executing or queued, by every way on both protocols."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e import leaving_grpc, leaving_http
from tests.e2e.leaving import (
    PENDING,
    REASON_TEXT,
    Way,
    assert_stopped_soon,
    cancel_line,
    cancellations,
    new_id,
    occupied,
    records_for,
    run_marker,
    wait_for_cancellations,
)
from tests.e2e.observe import wait_for_metric
from tests.server_process import TritiumProcess

WAYS = leaving_http.ways() + leaving_grpc.ways()
# A leave after the answer is complete; a deadline or a killed process has no "after".
FINISHABLE = [way for way in WAYS if way.finishable and way.model == "slow"]
BLS_WAYS = (leaving_http.ways([("infer", "bls"), ("generate", "bls")], ("fin", "killed"))
            + leaving_http.ways([("generate_stream", "bls")], ("rst",))
            + leaving_grpc.stub_ways([("unary", "bls")])
            + leaving_grpc.stub_ways([("stream", "bls")], ("cancel",)))


def way_id(way: Way) -> str:
    return way.id


@pytest.mark.parametrize("way", WAYS, ids=way_id)
def test_leaving_cancels_an_executing_request(server: TritiumProcess, record_dir: Path,
                                              way: Way) -> None:
    records = records_for(record_dir, way.model)
    rid = new_id()
    before = cancellations(server, way.model, way.reason, "executing")
    sent = way.start(server, rid)
    try:
        records.wait_for(rid, "start")
        assert_stopped_soon(records, rid, sent.leave())
        line = server.wait_for_line(cancel_line(rid, way.model, "executing"))
        assert line.endswith(f": {REASON_TEXT[way.reason]}"), line
        wait_for_cancellations(server, way.model, way.reason, "executing", before + 1)
        sent.check_client()
    finally:
        sent.close()


@pytest.mark.parametrize("way", WAYS, ids=way_id)
def test_leaving_removes_a_queued_request(server: TritiumProcess, record_dir: Path,
                                          way: Way) -> None:
    records = records_for(record_dir, way.model)
    rid = new_id()
    with occupied(server, records, way.model):
        before = cancellations(server, way.model, way.reason, "queued")
        sent = way.start(server, rid)
        try:
            if way.deadline_s is None:  # a deadline may pass before the gauge is read
                wait_for_metric(server.metrics_url, PENDING, 1, model=way.model)
            sent.leave()
            line = server.wait_for_line(cancel_line(rid, way.model, "queued"))
            assert line.endswith(f": {REASON_TEXT[way.reason]}"), line
            wait_for_metric(server.metrics_url, PENDING, 0, model=way.model)
            wait_for_cancellations(server, way.model, way.reason, "queued", before + 1)
            sent.check_client()
        finally:
            sent.close()
    run_marker(server, records, way.model)
    assert records.events(rid) == []


@pytest.mark.parametrize("way", FINISHABLE, ids=way_id)
def test_request_finished_before_leaving_is_not_cancelled(server: TritiumProcess,
                                                          record_dir: Path, way: Way) -> None:
    records = records_for(record_dir, way.model)
    rid = new_id()
    sent = way.start(server, rid, seconds=0.01)
    try:
        sent.answered()
        sent.leave()
    finally:
        sent.close()
    run_marker(server, records, way.model)
    assert records.events(rid) == ["start", "done"]
    assert f"request {rid} " not in server.log()


@pytest.mark.parametrize("way", BLS_WAYS, ids=way_id)
def test_bls_child_is_cancelled_with_its_parent(server: TritiumProcess, record_dir: Path,
                                                way: Way) -> None:
    children = records_for(record_dir, "slow_child")
    rid = new_id()  # bls gives its child the parent's id
    before = cancellations(server, "slow_child", "PARENT_CANCELLED", "executing")
    sent = way.start(server, rid)
    try:
        children.wait_for(rid, "start")
        assert_stopped_soon(children, rid, sent.leave())
        line = server.wait_for_line(cancel_line(rid, "slow_child", "executing"))
        assert line.endswith(": parent request cancelled"), line
        parent = server.wait_for_line(cancel_line(rid, "bls", "executing"))
        assert parent.endswith(f": {REASON_TEXT[way.reason]}"), parent
        wait_for_cancellations(server, "slow_child", "PARENT_CANCELLED", "executing", before + 1)
        sent.check_client()
    finally:
        sent.close()
