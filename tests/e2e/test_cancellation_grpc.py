"""The gRPC cancellation matrix: {unary, stream} x {cancel, deadline, killed client} x
{plain, decoupled model} x {executing, queued}; what the model saw, what the server logged."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.e2e.observe import Records, wait_for_metric
from tests.server_process import TritiumProcess

PENDING = "nv_inference_pending_request_count"


def new_id() -> str:
    return "c" + uuid.uuid4().hex[:12]


def infer_request(model: str, request_id: str, seconds: float) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1])
    request.raw_input_contents.append(np.array([seconds], dtype=np.float32).tobytes())
    return request


@pytest.fixture(scope="module")
def records(record_dir: Path) -> Records:
    return Records(record_dir / "slow.jsonl")


@pytest.fixture()
def stub(server: TritiumProcess) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    channel = grpc.insecure_channel(server.grpc_url)
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


@contextmanager
def occupied(stub: Any, records: Records, model: str) -> Iterator[None]:
    """The model's only instance busy with another stream's request, so the next one queues."""
    holder = new_id()
    hold = threading.Event()
    call = stub.ModelStreamInfer(_held([infer_request(model, holder, 30)], hold))
    records.wait_for(holder, "start")
    try:
        yield
    finally:
        call.cancel()
        hold.set()
        records.wait_for(holder, "cancelled")


def _held(requests: list[Any], hold: threading.Event) -> Iterator[Any]:
    """Sends ``requests``, then keeps the stream open (no half-close) until ``hold`` is set."""
    yield from requests
    hold.wait(60)


class Call:
    """One request on a unary or a streaming RPC, which the test then abandons."""

    def __init__(self, stub: Any, rpc: str, model: str, request_id: str, deadline: float | None):
        request = infer_request(model, request_id, 30)
        self.hold = threading.Event()
        if rpc == "unary":
            self.call = stub.ModelInfer.future(request, timeout=deadline)
        else:
            self.call = stub.ModelStreamInfer(_held([request], self.hold), timeout=deadline)
            threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        try:
            for _ in self.call:
                pass
        except grpc.RpcError:
            pass

    def cancel(self) -> None:
        self.call.cancel()
        self.hold.set()


CELLS = [("unary", "slow"), ("stream", "slow"), ("stream", "slow_decoupled")]
LEAVES = {"cancel": "client cancelled", "deadline": "deadline exceeded"}


@pytest.mark.parametrize("leave", list(LEAVES))
@pytest.mark.parametrize(("rpc", "model"), CELLS)
def test_executing_request_is_cancelled(server: TritiumProcess, stub: Any, records: Records,
                                        rpc: str, model: str, leave: str) -> None:
    rid = new_id()
    call = Call(stub, rpc, model, rid, deadline=1.5 if leave == "deadline" else None)
    try:
        records.wait_for(rid, "start")
        if leave == "cancel":
            call.cancel()
        records.wait_for(rid, "cancelled", timeout=5)
    finally:
        call.cancel()
    line = server.wait_for_line(f"request {rid} for model '{model}' version 1 cancelled while "
                                "executing")
    assert LEAVES[leave] in line
    assert "done" not in records.events(rid)


@pytest.mark.parametrize("leave", list(LEAVES))
@pytest.mark.parametrize(("rpc", "model"), CELLS)
def test_queued_request_never_runs(server: TritiumProcess, stub: Any, records: Records,
                                   rpc: str, model: str, leave: str) -> None:
    rid = new_id()
    with occupied(stub, records, model):
        call = Call(stub, rpc, model, rid, deadline=1.0 if leave == "deadline" else None)
        try:
            if leave == "cancel":
                wait_for_metric(server.metrics_url, PENDING, 1, model=model)
                call.cancel()
            line = server.wait_for_line(f"request {rid} for model '{model}' version 1 "
                                        "cancelled while queued")
            assert LEAVES[leave] in line
            wait_for_metric(server.metrics_url, PENDING, 0, model=model)
        finally:
            call.cancel()
    assert records.events(rid) == []


CLIENT = """
import sys, threading, grpc, numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc
url, rpc, model, rid = sys.argv[1:5]
request = service_pb2.ModelInferRequest(model_name=model, id=rid)
request.inputs.add(name="INPUT0", datatype="FP32", shape=[1])
request.raw_input_contents.append(np.array([30], dtype=np.float32).tobytes())
stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(url))
def held():
    yield request
    threading.Event().wait()
if rpc == "unary":
    stub.ModelInfer(request)
else:
    for _ in stub.ModelStreamInfer(held()):
        pass
"""


@pytest.mark.parametrize(("rpc", "model"), CELLS)
def test_killed_client_process_cancels(server: TritiumProcess, records: Records, rpc: str,
                                       model: str) -> None:
    rid = new_id()
    client = subprocess.Popen([sys.executable, "-c", CLIENT, server.grpc_url, rpc, model, rid])
    try:
        records.wait_for(rid, "start")
    finally:
        client.kill()
        client.wait()
    records.wait_for(rid, "cancelled", timeout=5)
    server.wait_for_line(f"request {rid} for model '{model}' version 1 cancelled while executing")


@pytest.mark.parametrize(("rpc", "model"), CELLS)
def test_killed_client_process_removes_queued(server: TritiumProcess, stub: Any,
                                              records: Records, rpc: str, model: str) -> None:
    rid = new_id()
    with occupied(stub, records, model):
        client = subprocess.Popen([sys.executable, "-c", CLIENT, server.grpc_url, rpc, model,
                                   rid])
        try:
            wait_for_metric(server.metrics_url, PENDING, 1, model=model)
        finally:
            client.kill()
            client.wait()
        server.wait_for_line(f"request {rid} for model '{model}' version 1 cancelled while "
                             "queued")
    assert records.events(rid) == []


@pytest.mark.parametrize("rpc", ["unary", "stream"])
def test_request_finished_before_leaving_is_not_cancelled(server: TritiumProcess,
                                                          records: Records, rpc: str) -> None:
    rid = new_id()
    channel = grpc.insecure_channel(server.grpc_url)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    if rpc == "unary":
        reply = stub.ModelInfer(infer_request("slow", rid, 0.01), timeout=30)
        assert reply.id == rid
    else:
        hold = threading.Event()
        call = stub.ModelStreamInfer(_held([infer_request("slow", rid, 0.01)], hold))
        first = next(iter(call))
        assert first.infer_response.id == rid and not first.error_message
        call.cancel()  # the only request of the stream has already been answered
        hold.set()
    channel.close()
    marker = new_id()
    with grpc.insecure_channel(server.grpc_url) as after:
        service_pb2_grpc.GRPCInferenceServiceStub(after).ModelInfer(
            infer_request("slow", marker, 0), timeout=30)
    assert records.events(rid) == ["start", "done"]
    assert f"request {rid} " not in server.log()
