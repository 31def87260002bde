"""Sequence batching, direct strategy of a batching model: each sequence keeps one batch
slot, empty slots are padded with not-ready requests, and only real requests are answered."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.e2e import test_protocols
from tests.e2e.observe import Records, wait_for_metric
from tests.e2e.test_protocols import Client
from tests.e2e.test_sequences import new_sequence
from tests.server_process import TritiumProcess

client = test_protocols.client  # the fixture: each test over HTTP and over gRPC

MODEL = "sequence_slots"
PENDING = "nv_inference_pending_request_count"


def step(client: Client, sequence: int, value: int, start: bool = False, end: bool = False,
         delay: float | None = None, model: str = MODEL, request_id: str = ""
         ) -> tuple[int, dict[str, Any]]:
    """One request of ``sequence``; the running sum of its slot and what the model saw."""
    inputs = {"INPUT0": np.array([[value]], dtype=np.int32)}
    if delay is not None:
        inputs["DELAY"] = np.array([[delay]], dtype=np.float32)
    outputs, _ = client.infer(model, inputs, sequence_id=sequence, sequence_start=start,
                              sequence_end=end, request_id=request_id)
    seen = outputs["SEEN"].reshape(-1)[0]
    return int(outputs["SUM"].reshape(-1)[0]), json.loads(seen)


def step_on(protocol: str, server: TritiumProcess, *args: Any, **options: Any
            ) -> tuple[int, dict[str, Any]]:
    """``step`` on a client of its own (for a thread)."""
    client = Client(protocol, server)
    try:
        return step(client, *args, **options)
    finally:
        client.raw.close()


def ready(seen: dict[str, Any]) -> list[int]:
    return [int(entry["ready"]) for entry in seen["batch"]]


def end_all(client: Client, sequences: list[int], model: str = MODEL) -> None:
    for sequence in sequences:
        step(client, sequence, 0, end=True, model=model)


def test_each_sequence_keeps_its_slot_and_empty_slots_are_padded(client: Client) -> None:
    """Triton docs "Direct": each sequence is given a batch slot for its lifetime; a batch
    covers slots 0 to the highest with a request, and an empty slot gets a request whose
    READY control is 0 (inputs zeroed, CORRID 0)."""
    a, b, c = new_sequence(), new_sequence(), new_sequence()
    try:
        assert step(client, a, 1, start=True)[1]["slot"] == 0
        total, seen = step(client, b, 10, start=True)
        assert (total, seen["slot"], ready(seen)) == (10, 1, [0, 1])
        padding = seen["batch"][0]
        assert padding["corrid"] == 0 and padding["start"] == 0 and padding["end"] == 0
        assert padding["input"] == 0 and padding["id"] == "" and padding["outputs"] == []
        assert seen["batch"][1]["corrid"] == b and seen["batch"][1]["ready"] == 1
        total, seen = step(client, c, 100, start=True)
        assert (total, seen["slot"], ready(seen)) == (100, 2, [0, 0, 1])
        # The model's per-slot state is each sequence's own.
        assert step(client, b, 20)[0] == 30
        assert step(client, a, 2)[0] == 3
        total, seen = step(client, c, 300, end=True)
        assert (total, seen["slot"]) == (400, 2)
        # c's slot is free again: a new sequence takes the lowest free slot.
        d = new_sequence()
        total, seen = step(client, d, 5, start=True)
        assert (total, seen["slot"]) == (5, 2)
        end_all(client, [d])
    finally:
        end_all(client, [a, b])


def test_requests_of_several_sequences_share_a_batch(client: Client, server: TritiumProcess,
                                                     record_dir: Path) -> None:
    """While slot 0's request executes, requests of slots 1 and 2 queue; the next batch
    carries both, with slot 0 padded, and each client gets its own answer only."""
    records = Records(record_dir / f"{MODEL}.jsonl")
    a, b, c = new_sequence(), new_sequence(), new_sequence()
    with ThreadPoolExecutor(3) as pool:
        try:
            step(client, a, 1, start=True)
            step(client, b, 10, start=True)
            step(client, c, 100, start=True)
            holder = f"hold-{uuid.uuid4().hex[:8]}"
            held = pool.submit(step_on, client.protocol, server, a, 1, delay=1.0,
                               request_id=holder)
            records.wait_for(holder, "start")
            queued = [pool.submit(step_on, client.protocol, server, sequence, value)
                      for sequence, value in ((b, 20), (c, 200))]
            wait_for_metric(server.metrics_url, PENDING, 2, model=MODEL, timeout=30)
            assert held.result(timeout=30)[0] == 2
            (b_total, b_seen), (c_total, c_seen) = (f.result(timeout=30) for f in queued)
            assert (b_total, c_total) == (30, 300)
            assert (b_seen["slot"], c_seen["slot"]) == (1, 2)
            assert ready(b_seen) == ready(c_seen) == [0, 1, 1]
        finally:
            end_all(client, [a, b, c])


def test_a_batch_waits_for_slot_utilization(client: Client, server: TritiumProcess) -> None:
    """``minimum_slot_utilization: 0.5`` of 4 slots with a 3 s queue delay: a lone request
    waits out the delay; two sequences' requests go at once, together."""
    model = "sequence_slots_delayed"
    a, b = new_sequence(), new_sequence()
    began = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        try:
            first = pool.submit(step_on, client.protocol, server, a, 1, start=True,
                                model=model)
            wait_for_metric(server.metrics_url, PENDING, 1, model=model, timeout=30)
            second = pool.submit(step_on, client.protocol, server, b, 2, start=True,
                                 model=model)
            (_, a_seen), (_, b_seen) = first.result(timeout=30), second.result(timeout=30)
            assert ready(a_seen) == ready(b_seen) == [1, 1]
            assert time.monotonic() - began < 2.5  # utilization reached, not the delay
            began = time.monotonic()
            total, seen = step(client, a, 5, model=model)
            assert (total, ready(seen)) == (6, [1])
            assert time.monotonic() - began >= 2.9  # alone: it waited out the delay
        finally:
            end_all(client, [a, b], model)


def test_cancelling_a_queued_slot_request_is_prompt(server: TritiumProcess, record_dir: Path
                                                    ) -> None:
    """A request of a sequence queued behind a long batch is answered CANCELLED as soon as
    its client cancels; the model never sees it and the executing request goes on."""
    records = Records(record_dir / f"{MODEL}.jsonl")
    tag = uuid.uuid4().hex[:8]
    a, b = new_sequence(), new_sequence()
    client = Client("grpc", server)
    try:
        step(client, a, 1, start=True)
        step(client, b, 10, start=True)
        holder = f"hold-{tag}"
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(step_on, "grpc", server, a, 1, delay=3.0, request_id=holder)
            records.wait_for(holder, "start")
            outcome: Future[Any] = Future()
            inputs = [grpcclient.InferInput("INPUT0", [1, 1], "INT32")]
            inputs[0].set_data_from_numpy(np.array([[5]], dtype=np.int32))
            call = client.raw.async_infer(MODEL, inputs, _set(outcome), sequence_id=b,
                                          request_id=f"queued-{tag}")
            wait_for_metric(server.metrics_url, PENDING, 1, model=MODEL, timeout=30)
            cancelled_at = time.monotonic()
            call.cancel()
            result, error = outcome.result(timeout=30)
            assert result is None and isinstance(error, InferenceServerException)
            assert "CANCELLED" in str(error.status())
            assert time.monotonic() - cancelled_at < 2.0  # not when the batch ends
            server.wait_for_line(f"request queued-{tag} for model '{MODEL}' version 1 "
                                 "cancelled while queued")
            assert held.result(timeout=30)[0] == 2
        assert records.events(f"queued-{tag}") == []
        # Its sequence was released with it, as a cancelled queued request's is.
        error = client.failure(lambda: step(client, b, 1))
        assert "START" in error.message()
    finally:
        end_all(client, [a])
        client.raw.close()


def _set(outcome: Future[Any]) -> Callable[[Any, Any], None]:
    def callback(result: Any, error: Any) -> None:
        if not outcome.done():
            outcome.set_result((result, error))
    return callback
