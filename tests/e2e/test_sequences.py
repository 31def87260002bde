"""Stateful models (sequence_batching): instance affinity, correlation ids and flags,
control tensors, idle release, and cancellation of a sequence's queued requests."""

from __future__ import annotations

import itertools
import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.e2e import test_protocols
from tests.e2e.observe import Records, wait_for_metric
from tests.e2e.test_protocols import Client
from tests.server_process import TritiumProcess

client = test_protocols.client  # the fixture: each test over HTTP and over gRPC

MODEL = "sequence_accumulator"
PENDING = "nv_inference_pending_request_count"
# Correlation ids unique to this run, so no test continues another test's sequence.
_ids = itertools.count(uuid.uuid4().int % (1 << 40) + 1)


def new_sequence() -> int:
    return next(_ids)


def step(client: Client, sequence: int, value: int, start: bool = False, end: bool = False,
         model: str = MODEL) -> tuple[int, dict[str, Any]]:
    """One request of ``sequence``; returns the running sum and what the model saw."""
    outputs, _ = client.infer(model, {"INPUT0": np.array([value], dtype=np.int32)},
                              sequence_id=sequence, sequence_start=start, sequence_end=end)
    seen = outputs["SEEN"][0]
    return int(outputs["SUM"][0]), json.loads(seen.decode() if isinstance(seen, bytes) else seen)


def test_interleaved_sequences_keep_their_state_and_instance(client: Client) -> None:
    a, b = new_sequence(), new_sequence()
    sums: dict[int, list[int]] = {a: [], b: []}
    instances: dict[int, set[str]] = {a: set(), b: set()}
    plan = [(a, 1), (b, 10), (a, 2), (b, 20), (a, 3), (b, 30)]
    for n, (sequence, value) in enumerate(plan):
        total, seen = step(client, sequence, value, start=n < 2, end=n >= 4)
        sums[sequence].append(total)
        instances[sequence].add(seen["instance"])
    assert sums == {a: [1, 3, 6], b: [10, 30, 60]}
    assert len(instances[a]) == len(instances[b]) == 1
    assert instances[a] != instances[b]  # a new sequence goes to the least busy instance


def test_control_tensors_reach_the_model(client: Client) -> None:
    sequence = new_sequence()
    seen = [step(client, sequence, 1, start=True)[1], step(client, sequence, 1)[1],
            step(client, sequence, 1, end=True)[1]]
    controls = [s["controls"] for s in seen]
    assert controls[0] == {"START": 1, "END": False, "READY": 1.0, "CORRID": sequence}
    assert controls[1] == {"START": 0, "END": False, "READY": 1.0, "CORRID": sequence}
    assert controls[2] == {"START": 0, "END": True, "READY": 1.0, "CORRID": sequence}
    assert [s["flags"] for s in seen] == [1, 0, 2]
    assert {s["correlation_id"] for s in seen} == {sequence}


def test_a_correlation_id_is_required(client: Client) -> None:
    error = client.failure(lambda: client.infer(
        MODEL, {"INPUT0": np.array([1], dtype=np.int32)}, sequence_start=True))
    assert error.status() == client.status("INVALID_ARG")
    assert (f"inference request to model '{MODEL}' must specify a non-zero or non-empty "
            "correlation ID") in error.message()


def test_an_unknown_sequence_needs_start(client: Client) -> None:
    sequence = new_sequence()
    error = client.failure(lambda: step(client, sequence, 1))
    assert error.status() == client.status("INVALID_ARG")
    assert f"sequence {sequence}" in error.message() and "START" in error.message()
    step(client, sequence, 1, start=True, end=True)
    error = client.failure(lambda: step(client, sequence, 1))  # END released it
    assert error.status() == client.status("INVALID_ARG")


def test_an_idle_sequence_is_released(server: TritiumProcess, client: Client) -> None:
    sequence = new_sequence()
    mark = len(server.lines)
    assert step(client, sequence, 5, start=True, model="sequence_idle")[0] == 5
    assert step(client, sequence, 1, model="sequence_idle")[0] == 6
    server.wait_for_line(f"sequence {sequence} for model 'sequence_idle' version 1 released: "
                         "no request for 300000 us", timeout=10, start=mark)
    error = client.failure(lambda: step(client, sequence, 1, model="sequence_idle"))
    assert error.status() == client.status("INVALID_ARG") and "START" in error.message()


# -- cancellation (gRPC: the client cancels its call) --------------------------------------
def grpc_request(request_id: str, sequence: int, value: int, start: bool = False,
                 delay: float | None = None) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=MODEL, id=request_id)
    request.parameters["sequence_id"].uint64_param = sequence
    request.parameters["sequence_start"].bool_param = start
    request.inputs.add(name="INPUT0", datatype="INT32", shape=[1])
    request.raw_input_contents.append(np.array([value], dtype=np.int32).tobytes())
    if delay is not None:
        request.inputs.add(name="DELAY", datatype="FP32", shape=[1])
        request.raw_input_contents.append(np.array([delay], dtype=np.float32).tobytes())
    return request


@pytest.fixture()
def stub(server: TritiumProcess) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    channel = grpc.insecure_channel(server.grpc_url)
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def test_cancelling_a_queued_request_cancels_its_sequence(
        server: TritiumProcess, stub: Any, record_dir: Path) -> None:
    records = Records(record_dir / f"{MODEL}.jsonl")
    sequence = new_sequence()
    tag = uuid.uuid4().hex[:8]
    holder, first, second = f"hold-{tag}", f"q1-{tag}", f"q2-{tag}"
    held = stub.ModelInfer.future(grpc_request(holder, sequence, 1, start=True, delay=30))
    try:
        records.wait_for(holder, "start")
        queued = [stub.ModelInfer.future(grpc_request(rid, sequence, 1)) for rid in
                  (first, second)]
        wait_for_metric(server.metrics_url, PENDING, 2, model=MODEL)
        queued[0].cancel()
        for rid in (first, second):
            line = server.wait_for_line(f"request {rid} for model '{MODEL}' version 1 "
                                        "cancelled while queued")
            assert "client cancelled" in line
        with pytest.raises(grpc.RpcError) as caught:
            queued[1].result(timeout=10)
        assert caught.value.code() is grpc.StatusCode.CANCELLED
        server.wait_for_line(f"sequence {sequence} for model '{MODEL}' version 1 released")
        wait_for_metric(server.metrics_url, PENDING, 0, model=MODEL)
        # The executing request goes on undisturbed.
        assert records.events(holder) == ["start"]
    finally:
        held.cancel()
    records.wait_for(holder, "cancelled")
    assert records.events(first) == records.events(second) == []
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(grpc_request(f"after-{tag}", sequence, 1), timeout=10)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT


def test_requests_of_one_sequence_run_one_at_a_time(stub: Any, record_dir: Path) -> None:
    records = Records(record_dir / f"{MODEL}.jsonl")
    sequence = new_sequence()
    tag = uuid.uuid4().hex[:8]
    ids = [f"order{n}-{tag}" for n in range(3)]
    sums: dict[int, int] = {}

    def send(n: int) -> None:
        request = grpc_request(ids[n], sequence, n + 1, start=n == 0, delay=0.1)
        response = stub.ModelInfer(request, timeout=30)
        sums[n] = int(np.frombuffer(response.raw_output_contents[0], dtype=np.int32)[0])

    send(0)
    threads = [threading.Thread(target=send, args=(n,)) for n in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sums[0] == 1 and max(sums.values()) == 6
    spans = sorted((records.times(rid, "start")[0], records.times(rid, "done")[0])
                   for rid in ids)
    for (_, done), (start, _) in itertools.pairwise(spans):
        assert done <= start  # never two at once
    rows = [json.loads(line) for line in records.path.read_text().splitlines()]
    assert len({row["instance"] for row in rows if row["id"] in ids}) == 1
    end = grpc_request(f"end-{tag}", sequence, 0)
    end.parameters["sequence_end"].bool_param = True
    stub.ModelInfer(end, timeout=30)
