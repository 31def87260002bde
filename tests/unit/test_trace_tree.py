"""A trace tree recorded into Triton's trace-file records: ids, parents, when a tree is
written, and what a cancellation adds (no server)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from tritium.core import tracing
from tritium.core.types import DataType, Tensor
from tritium.tracing.file import FileSink, TraceFile
from tritium.tracing.trace import RootTrace, WithoutTimestamps


def written(trace_file: TraceFile) -> list[dict[str, Any]]:
    trace_file.close()  # the array closes with the file
    return json.loads(Path(trace_file.path).read_text())


def stamps(records: list[dict[str, Any]], trace_id: int) -> list[str]:
    return [r["timestamps"][0]["name"] for r in records
            if r["id"] == trace_id and "timestamps" in r]


def test_tree_is_written_once_every_span_ended(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    trace_file = TraceFile(str(path), 0)
    sink = FileSink(trace_file)
    root = RootTrace(sink, 1)
    root.event("HTTP_RECV_START", 2)
    parent = root.spawn("bls", 1, "r1", 3)
    parent.event(tracing.COMPUTE_START, 4)
    child = parent.spawn("child", 2, "", 5)  # made while the parent computes
    child.end(None, 6)
    parent.event(tracing.COMPUTE_END, 7)
    parent.end(None, 8)
    assert not path.exists()  # the frontend still holds the tree
    root.finish(9)
    records = written(trace_file)
    assert records[0] == {"id": root.id, "timestamps": [{"name": "HTTP_RECV_START", "ns": 2}]}
    assert {"id": parent.id, "model_name": "bls", "model_version": 1,
            "request_id": "r1"} in records
    assert {"id": child.id, "model_name": "child", "model_version": 2,
            "parent_id": parent.id} in records
    assert parent.id == root.id and child.id != parent.id  # as Triton numbers them
    assert stamps(records, child.id) == ["REQUEST_START", "REQUEST_END"]


def test_cancelled_decoupled_request_ends_when_the_model_stops(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    trace_file = TraceFile(str(path), 0)
    sink = FileSink(trace_file)
    root = RootTrace(sink, 0)
    executing = root.spawn("stream", 1, "", 1)
    executing.expect_stop()
    executing.cancelled("client disconnected", "executing", 1_000)
    executing.end("Request cancelled", 1_500)
    root.finish(1_600)
    assert not path.exists()  # the model has not sent FINAL yet
    executing.stopped(3_001_000)
    records = written(trace_file)
    assert {"id": executing.id,
            "cancel": {"reason": "client disconnected", "stage": "executing"}} in records
    assert {"id": executing.id, "cancel": {"stop_delay_us": 3000}} in records
    assert stamps(records, executing.id)[-3:] == [
        "REQUEST_CANCELLED", "REQUEST_END", "MODEL_STOPPED"]


def test_a_request_cancelled_in_the_queue_waits_for_nothing(tmp_path: Path) -> None:
    trace_file = TraceFile(str(tmp_path / "trace.json"), 0)
    root = RootTrace(FileSink(trace_file), 0)
    queued = root.spawn("stream", 1, "", 1)
    queued.expect_stop()
    queued.cancelled("deadline exceeded", "queued", 2)
    queued.end("Request timeout expired", 3)
    root.finish(4)
    assert stamps(written(trace_file), queued.id)[-2:] == ["REQUEST_CANCELLED", "REQUEST_END"]


def test_tensors_level_alone_records_no_timestamps(tmp_path: Path) -> None:
    trace_file = TraceFile(str(tmp_path / "trace.json"), 0)
    sink = WithoutTimestamps(FileSink(trace_file))
    root = RootTrace(sink, 0, tensors=True)
    model = root.spawn("m", 1, "", 1)
    words = Tensor("W", DataType.BYTES, (2,),
                   np.array([b"a", b"b"], dtype=np.object_))
    model.tensors(tracing.TENSOR_QUEUE_INPUT, [words])
    model.end(None, 2)
    root.finish(3)
    records = written(trace_file)
    assert not [r for r in records if "timestamps" in r]
    assert {"id": model.id, "activity": "TENSOR_QUEUE_INPUT", "tensor": {
        "name": "W", "data": '"a","b"', "shape": "2", "dtype": "BYTES"}} in records
