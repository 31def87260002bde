"""A step's error ends an ensemble request only once its running steps have finished, as
Triton's ensemble scheduler answers it; a client that leaves meanwhile still stops them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.e2e.ensemble_zoo import ensemble_records, ensemble_server  # noqa: F401 - fixtures
from tests.e2e.leaving import new_id
from tests.e2e.observe import Records, metric, wait_until
from tests.e2e.test_ensembles import PROTOCOLS, infer
from tests.server_process import TritiumProcess

MODEL = "failing_beside_slow"
FAILURES = "nv_inference_request_failure"


@pytest.fixture
def server(ensemble_server: TritiumProcess) -> Iterator[TritiumProcess]:  # noqa: F811
    yield ensemble_server


@pytest.fixture
def slow(ensemble_records: Path) -> Records:  # noqa: F811
    return Records(ensemble_records / "slow_beside.jsonl")


def raised(server: TritiumProcess) -> float:
    return metric(server.metrics_url, FAILURES, model="raises_step", reason="BACKEND")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_error_waits_for_the_running_step(server: TritiumProcess, slow: Records,
                                              protocol: str) -> None:
    rid = new_id()
    with pytest.raises(InferenceServerException) as caught:
        infer(server, protocol, MODEL, {"INPUT0": np.array([1.0], dtype=np.float32)},
              request_id=rid)
    answered = time.monotonic()
    message = caught.value.message()
    assert message.startswith(f"in ensemble '{MODEL}', ") and "always fails" in message
    assert slow.events(rid) == ["start", "done"]  # not cancelled: it ran to its end
    assert slow.times(rid, "done")[0] <= answered


def test_leaving_while_the_error_waits_stops_the_running_step(server: TritiumProcess,
                                                              slow: Records) -> None:
    rid = new_id()
    before = raised(server)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    outcome: Future[Any] = Future()
    inputs = [grpcclient.InferInput("INPUT0", [1], "FP32")]
    inputs[0].set_data_from_numpy(np.array([30.0], dtype=np.float32))
    try:
        call = client.async_infer(MODEL, inputs, lambda r, e: outcome.set_result((r, e)),
                                  request_id=rid)
        slow.wait_for(rid, "start")
        wait_until(lambda: raised(server) == before + 1, "the failing step answered", timeout=30)
        assert not outcome.done()  # the error waits for the slow step
        left_at = time.monotonic()
        call.cancel()
        slow.wait_for(rid, "cancelled")
        assert slow.times(rid, "cancelled")[0] - left_at < 5.0
    finally:
        client.close()
