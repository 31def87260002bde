"""A gRPC client that cancels, runs out of time or half-closes: what the model sees."""

from __future__ import annotations

import asyncio
import queue
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from tests.e2e.observe import Records, metric, wait_for_metric
from tests.server_process import TritiumProcess

CANCELLED = "tritium_inference_cancellation"
# How long a model may keep working after its client left; generous for a busy CI machine.
STOP_BOUND_S = 1.0


@pytest.fixture(scope="module")
def slow(record_dir: Path) -> Records:
    return Records(record_dir / "slow.jsonl")


@pytest.fixture(scope="module")
def pair(record_dir: Path) -> Records:
    return Records(record_dir / "slow_pair.jsonl")


def new_id() -> str:
    return "g" + uuid.uuid4().hex[:12]


def seconds_input(value: float, module: Any = grpcclient) -> Any:
    tensor = module.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([value], dtype=np.float32))
    return tensor


def cancellations(server: TritiumProcess, model: str, reason: str) -> float:
    return metric(server.metrics_url, CANCELLED, model=model, reason=reason, stage="executing")


def assert_stopped_soon(timeline: Records, request_id: str, left_at: float) -> None:
    stopped = timeline.wait_for(request_id, "cancelled")
    assert stopped - left_at < STOP_BOUND_S, f"model stopped {stopped - left_at:.3f} s late"
    assert not timeline.times(request_id, "done")


# ------------------------------------------------------------------------ unary


def test_sync_unary_cancel(server: TritiumProcess, slow: Records) -> None:
    rid = new_id()
    before = cancellations(server, "slow", "CLIENT_CANCELLED")
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        call = client.async_infer("slow", [seconds_input(5)], lambda **_: None, request_id=rid)
        slow.wait_for(rid, "start")
        left_at = time.monotonic()
        call.cancel()
        assert_stopped_soon(slow, rid, left_at)
    wait_for_metric(server.metrics_url, CANCELLED, before + 1, model="slow",
                    reason="CLIENT_CANCELLED", stage="executing")


def test_aio_unary_cancel(server: TritiumProcess, slow: Records) -> None:
    rid = new_id()

    async def run() -> float:
        async with aioclient.InferenceServerClient(server.grpc_url) as client:
            task = asyncio.ensure_future(
                client.infer("slow", [seconds_input(5, aioclient)], request_id=rid))
            await slow.wait_for_async(rid, "start")
            left_at = time.monotonic()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return left_at

    assert_stopped_soon(slow, rid, asyncio.run(run()))


def test_unary_deadline(server: TritiumProcess, slow: Records) -> None:
    rid = new_id()
    before = cancellations(server, "slow", "DEADLINE")
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        started = time.monotonic()
        with pytest.raises(InferenceServerException) as info:
            client.infer("slow", [seconds_input(5)], request_id=rid, client_timeout=0.5)
    assert info.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    assert_stopped_soon(slow, rid, started + 0.5)
    wait_for_metric(server.metrics_url, CANCELLED, before + 1, model="slow",
                    reason="DEADLINE", stage="executing")


# ----------------------------------------------------------------------- stream


def test_sync_stream_cancel_cancels_every_request(server: TritiumProcess,
                                                  pair: Records) -> None:
    ids = [new_id(), new_id()]
    results: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(lambda result, error: results.put((result, error)))
        for rid in ids:
            client.async_stream_infer("slow_pair", [seconds_input(5)], request_id=rid)
        for rid in ids:
            pair.wait_for(rid, "start")
        left_at = time.monotonic()
        client.stop_stream(cancel_requests=True)
    for rid in ids:
        assert_stopped_soon(pair, rid, left_at)
    assert all(result is None for result, _ in list(results.queue))


def test_aio_stream_cancel(server: TritiumProcess, pair: Records) -> None:
    rid = new_id()

    async def run() -> float:
        release = asyncio.Event()

        async def requests() -> Any:
            yield {"model_name": "slow_pair", "inputs": [seconds_input(5, aioclient)],
                   "request_id": rid}
            await release.wait()  # keep the stream open until it is cancelled

        async with aioclient.InferenceServerClient(server.grpc_url) as client:
            responses = client.stream_infer(requests())
            reader = asyncio.ensure_future(anext(aiter(responses), None))
            await pair.wait_for_async(rid, "start")
            left_at = time.monotonic()
            responses.cancel()
            with pytest.raises((asyncio.CancelledError, InferenceServerException)):
                await reader
            release.set()
            return left_at

    assert_stopped_soon(pair, rid, asyncio.run(run()))


def test_stream_half_close_cancels_nothing(server: TritiumProcess, pair: Records) -> None:
    rid = new_id()
    results: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(lambda result, error: results.put((result, error)))
        client.async_stream_infer("slow_pair", [seconds_input(0.3)], request_id=rid)
        pair.wait_for(rid, "start")
        client.stop_stream()  # half-close while the request runs: it must still answer
    result, error = results.get_nowait()
    assert error is None and result.get_response().id == rid
    assert pair.times(rid, "done") and not pair.times(rid, "cancelled")
