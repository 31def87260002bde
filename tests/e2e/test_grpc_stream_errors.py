"""ModelStreamInfer opened with ``triton_grpc_error: true``: the first failed response ends
the stream with its gRPC status, as Triton's stream handler does."""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.e2e.observe import Records
from tests.server_process import TritiumProcess

ERROR_MODE = {"triton_grpc_error": "true"}
Results = queue.Queue[tuple[Any, InferenceServerException | None]]


def tensor(name: str, data: np.ndarray) -> grpcclient.InferInput:
    datatype = "BYTES" if data.dtype == object else "FP32"
    item = grpcclient.InferInput(name, list(data.shape), datatype)
    item.set_data_from_numpy(data)
    return item


def fp32(value: float) -> np.ndarray:
    return np.array([value], dtype=np.float32)


def text(value: str) -> np.ndarray:
    return np.array([value.encode()], dtype=object)


def open_stream(client: grpcclient.InferenceServerClient, headers: dict[str, str] | None
                ) -> Results:
    results: Results = queue.Queue()
    client.start_stream(lambda result, error: results.put((result, error)), headers=headers)
    return results


@pytest.mark.parametrize("code, status", [("INTERNAL", "StatusCode.INTERNAL"),
                                          ("INVALID_ARG", "StatusCode.INVALID_ARGUMENT")])
def test_a_failed_response_ends_the_stream_with_its_status(
        server: TritiumProcess, code: str, status: str) -> None:
    """Triton's lifecycle test sends one good request, then one whose model answers with an
    error, and expects the good answer followed by the stream's end carrying the error's
    code mapped to a gRPC status; nothing is answered after it."""
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        results = open_stream(client, ERROR_MODE)
        client.async_stream_infer("identity_fp32", [tensor("INPUT0", fp32(1.5))])
        result, error = results.get(timeout=30)
        assert error is None and result.as_numpy("OUTPUT0").tolist() == [1.5]
        client.async_stream_infer("error_response", [tensor("INPUT0", text(code))])
        _, error = results.get(timeout=30)
        assert isinstance(error, InferenceServerException)
        assert error.status() == status
        assert f"model refused: {code}" in str(error.message())
        client.stop_stream()  # joins the reader: anything more would be queued by now
        assert results.empty()


@pytest.mark.parametrize("headers", [None, {"triton_grpc_error": "false"}])
def test_without_error_mode_errors_stay_in_band(server: TritiumProcess,
                                                 headers: dict[str, str] | None) -> None:
    """Only the exact value "true" turns the mode on (Triton compares the header's value
    with that string); otherwise an error is one more message and the stream goes on."""
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        results = open_stream(client, headers)
        client.async_stream_infer("error_response", [tensor("INPUT0", text("INTERNAL"))])
        _, error = results.get(timeout=30)
        assert error is not None and "model refused: INTERNAL" in str(error.message())
        client.async_stream_infer("identity_fp32", [tensor("INPUT0", fp32(2.5))])
        result, error = results.get(timeout=30)
        assert error is None and result.as_numpy("OUTPUT0").tolist() == [2.5]
        client.stop_stream()


@pytest.mark.parametrize("mode", ["final", "late_final"])
def test_a_decoupled_error_ends_the_stream_once(server: TritiumProcess, mode: str) -> None:
    """Triton's decoupled error test: a response, then an error (with FINAL, or with FINAL
    sent later by the model), gives the response, then the stream's INTERNAL end, then
    nothing, and the server lives on. A request refused before it reaches a model is
    still answered in-band: Triton's handler writes such errors as messages."""
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        results = open_stream(client, ERROR_MODE)
        client.async_stream_infer("no_such_model", [tensor("INPUT0", fp32(0))])
        _, refused = results.get(timeout=30)
        assert refused is not None and "unknown model" in str(refused.message())
        client.async_stream_infer("decoupled_error",
                                  [tensor("INPUT0", fp32(4.0)), tensor("MODE", text(mode))])
        result, error = results.get(timeout=30)
        assert error is None and result.as_numpy("OUTPUT0").tolist() == [4.0]
        _, error = results.get(timeout=30)
        assert isinstance(error, InferenceServerException)
        assert error.status() == "StatusCode.INTERNAL"
        assert "the model failed" in str(error.message())
        client.stop_stream()
        assert results.empty()
        assert client.is_server_live()


class OpenRequests:
    """A request iterator that stays open (no half-close) until ``close``."""

    def __init__(self) -> None:
        self.queue: queue.Queue[pb.ModelInferRequest | None] = queue.Queue()

    def __iter__(self) -> Iterator[pb.ModelInferRequest]:
        while (message := self.queue.get()) is not None:
            yield message

    def close(self) -> None:
        self.queue.put(None)


def message(model: str, request_id: str, data: np.ndarray) -> pb.ModelInferRequest:
    found = pb.ModelInferRequest(model_name=model, id=request_id)
    found.inputs.add(name="INPUT0", datatype="BYTES" if data.dtype == object else "FP32",
                     shape=list(data.shape))
    if data.dtype == object:
        found.raw_input_contents.append(
            b"".join(len(e).to_bytes(4, "little") + e for e in data.tolist()))
    else:
        found.raw_input_contents.append(data.tobytes())
    return found


def test_the_end_cancels_the_other_requests_at_once(server: TritiumProcess,
                                                    record_dir: Path) -> None:
    """Triton finishes the call on the first error; the call's end then cancels what is
    still in flight on it. The client has not half-closed, and a 30 s request is running:
    the stream still ends at once, and the model sees its request cancelled."""
    records = Records(record_dir / "slow_pair.jsonl")
    long_id = "long-" + uuid.uuid4().hex[:8]
    requests = OpenRequests()
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        replies = stub.ModelStreamInfer(iter(requests), timeout=60,
                                        metadata=tuple(ERROR_MODE.items()))
        requests.queue.put(message("slow_pair", long_id, fp32(30.0)))
        records.wait_for(long_id, "start")
        started = time.monotonic()
        requests.queue.put(message("error_response", "bad", text("UNAVAILABLE")))
        with pytest.raises(grpc.RpcError) as caught:
            next(iter(replies))
        assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "model refused: UNAVAILABLE" in str(caught.value.details())
        assert time.monotonic() - started < 10
        records.wait_for(long_id, "cancelled")
        threading.Thread(target=requests.close, daemon=True).start()
