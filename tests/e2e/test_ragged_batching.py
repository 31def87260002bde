"""Inputs of variable size in a dynamic batch, as Triton's batcher has them for any backend:
requests whose shapes differ are not batched together unless the input allows ragged
batches; a python model gets each request whole, and no batch input tensors."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient

from tests.e2e.test_batching import ModelRecords, new_id, pool, queue_up  # noqa: F401
from tests.server_process import TritiumProcess

WIDTHS = (2, 3, 2)


def infer_http(server: TritiumProcess, model: str, request_id: str, width: int,
               seconds: float = 0.0) -> Any:
    body = {"id": request_id, "inputs": [{"name": "INPUT0", "shape": [1, width],
                                          "datatype": "FP32", "data": [seconds] * width}]}
    reply = requests.post(f"http://{server.http_url}/v2/models/{model}/infer", json=body,
                          timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()["outputs"][0]["shape"]


def infer_grpc(server: TritiumProcess, model: str, request_id: str, width: int,
               seconds: float = 0.0) -> Any:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        tensor = grpcclient.InferInput("INPUT0", [1, width], "FP32")
        tensor.set_data_from_numpy(np.full((1, width), seconds, dtype=np.float32))
        return list(client.infer(model, [tensor], request_id=request_id)
                    .as_numpy("OUTPUT0").shape)
    finally:
        client.close()


CALLS = {"http": infer_http, "grpc": infer_grpc}


@contextmanager
def occupied(server: TritiumProcess, records: ModelRecords, model: str,
             pool: ThreadPoolExecutor, seconds: float) -> Iterator[None]:  # noqa: F811
    """The model's only instance is busy for ``seconds``."""
    request_id = new_id("busy")
    done = pool.submit(infer_http, server, model, request_id, 1, seconds)
    records.wait_started(request_id)
    yield
    done.result()


def batches_of(server: TritiumProcess, record_dir: Path, pool: ThreadPoolExecutor,  # noqa: F811
               model: str, protocol: str) -> list[list[int]]:
    """Requests of widths WIDTHS queued behind a busy instance; the batches they ran in."""
    records = ModelRecords(record_dir, model)
    call = CALLS[protocol]
    ids = [new_id("shape") for _ in WIDTHS]
    with occupied(server, records, model, pool, 1.0):
        futures = queue_up(server, pool, model, [
            functools.partial(call, server, model, i, w) for i, w in zip(ids, WIDTHS,
                                                                          strict=True)])
    # Each client gets its own tensor back, whatever it was batched with.
    assert [f.result() for f in futures] == [[1, w] for w in WIDTHS]
    return [[ids.index(i) for i in batch] for batch in records.batches(ids)]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_requests_of_different_shapes_are_not_batched_together(
        server: TritiumProcess, record_dir: Path, pool: ThreadPoolExecutor,  # noqa: F811
        protocol: str) -> None:
    # The third fits the first, but a batch never skips over the second.
    assert batches_of(server, record_dir, pool, "batch_shaped", protocol) == [[0], [1], [2]]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_input_that_allows_ragged_batches_is_batched_whatever_its_shape(
        server: TritiumProcess, record_dir: Path, pool: ThreadPoolExecutor,  # noqa: F811
        protocol: str) -> None:
    assert batches_of(server, record_dir, pool, "batch_ragged", protocol) == [[0, 1, 2]]
