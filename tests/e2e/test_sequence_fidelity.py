"""Triton's sequence batcher features a python model relies on: iterative sequences with
request rescheduling, and implicit state."""

from __future__ import annotations

import json
import queue
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient

from tests.e2e import test_protocols
from tests.e2e.observe import metric, wait_for_metric
from tests.e2e.test_generate import sse_events, url
from tests.e2e.test_protocols import Client
from tests.e2e.test_sequences import new_sequence, step
from tests.server_process import TritiumProcess
from tritium.core import messages

client = test_protocols.client  # the fixture: each test over HTTP and over gRPC

START, END = 1, 2
PENDING = "nv_inference_pending_request_count"


def executions(client: Client, model: str, times: int, **options: Any
               ) -> tuple[int, list[list[Any]]]:
    outputs, _ = client.infer(model, {"IN": np.array([times], dtype=np.int32)}, **options)
    seen = outputs["SEEN"][0]
    return int(outputs["OUT"][0]), json.loads(seen.decode() if isinstance(seen, bytes) else seen)


def test_a_rescheduled_request_is_answered_by_its_last_execution(client: Client) -> None:
    """python_backend README "Request Rescheduling" and Triton's request_rescheduling_addsub
    QA model: with ``iterative_sequence: true`` a non-decoupled model releases a request with
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE and returns None for it; it is executed again,
    and the client gets the one response of the execution that does not reschedule. A
    request without a correlation id gets one of its own with START (IterativeSequencer),
    and each rescheduled execution carries neither START nor END."""
    count, seen = executions(client, "reschedule_iterative", 3)
    assert count == 3
    ids = {cid for cid, _ in seen}
    assert len(ids) == 1 and ids != {0}
    assert [flags for _, flags in seen] == [START, 0, 0]
    # Concurrent requests keep apart: each has its own sequence.
    other, other_seen = executions(client, "reschedule_iterative", 2)
    assert other == 2 and {cid for cid, _ in other_seen}.isdisjoint(ids)


def test_a_client_sequence_id_is_kept_and_ended_by_the_last_execution(client: Client) -> None:
    """A request with its own correlation id keeps it; once an execution releases it
    without RESCHEDULE, Triton ends its sequence (a cancelled END marker), so a request
    continuing it needs START again."""
    sequence = new_sequence()
    count, seen = executions(client, "reschedule_iterative", 2, sequence_id=sequence,
                             sequence_start=True)
    assert count == 2 and seen == [[sequence, START], [sequence, 0]]
    error = client.failure(lambda: executions(client, "reschedule_iterative", 1,
                                              sequence_id=sequence))
    assert error.status() == client.status("INVALID_ARG")
    assert "must specify the START flag" in error.message()


def test_a_decoupled_model_streams_from_each_execution_over_grpc(server: TritiumProcess
                                                                  ) -> None:
    """Triton's iterative_sequence QA model and L0_backend_python request_rescheduling
    grpc_endpoint_test: a decoupled model sends a response, reschedules the request before
    execute returns, and sends FINAL from its last execution; the stream sees every
    response, counting down to 0."""
    results: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as raw:
        raw.start_stream(lambda result, error: results.put(error or result))
        tensor = grpcclient.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([3], dtype=np.int32))
        raw.async_stream_infer("reschedule_iterative_decoupled", [tensor],
                               enable_empty_final_response=True)
        got = []
        while True:
            item = results.get(timeout=60)
            assert not isinstance(item, Exception), item
            got.append(item)
            if item.get_response().parameters["triton_final_response"].bool_param:
                break
        raw.stop_stream()
    assert [int(r.as_numpy("OUT")[0]) for r in got] == [2, 1, 0]


def test_a_decoupled_model_streams_from_each_execution_over_http(server: TritiumProcess
                                                                  ) -> None:
    """The same model through /generate_stream: one event per execution's response."""
    with requests.post(url(server, "reschedule_iterative_decoupled", "generate_stream"),
                       json={"IN": 4}, stream=True, timeout=60) as reply:
        assert reply.status_code == 200
        events = sse_events(reply)
    assert [event["OUT"] for _, event in events] == [3, 2, 1, 0]
    last = json.loads(events[-1][1]["SEEN"])
    assert [flags for _, flags in last] == [START, 0, 0, 0]


def test_bls_requests_to_iterative_models_are_rescheduled(client: Client) -> None:
    """Triton's bls_request_rescheduling QA model: BLS requests without a correlation id to
    the non-decoupled and the decoupled iterative models get one response (after all the
    executions) and a stream counting down, as a client's requests do."""
    _, seen = executions(client, "bls_reschedule", 3)
    assert seen == {"count": 3, "stream": [2, 1, 0], "errors": []}


def test_a_response_returned_for_a_rescheduled_request_fails_it(client: Client) -> None:
    """python_backend pb_stub.cc ProcessReturnedResponses (and Triton's wrong_return_type
    QA model): the returned list must hold None for a rescheduled request; otherwise the
    execute fails with "Expected a None object in the execute function return list for
    reschduled request" (Triton's spelling), and nothing is rescheduled."""
    error = client.failure(lambda: executions(client, "reschedule_returns_response", 2))
    assert error.status() == client.status("INTERNAL")
    assert ("Expected a None object in the execute function return list for reschduled "
            "request, found type") in error.message()


@pytest.mark.parametrize("model", ["reschedule_not_iterative"])
def test_rescheduling_needs_an_iterative_sequence(client: Client, model: str) -> None:
    """core infer_request.cc: a request released with RESCHEDULE by a model not configured
    for it (no iterative sequence batching) is refused, and the python backend releases it
    with ALL. Triton's client would wait for a response that never comes; tritium answers
    with the core's refusal."""
    error = client.failure(lambda: executions(client, model, 2))
    assert error.status() == client.status("INTERNAL")
    assert messages.RESCHEDULE_NOT_CONFIGURED in error.message()


def test_a_decoupled_model_cannot_reschedule_without_an_iterative_sequence(
        server: TritiumProcess) -> None:
    """The same refusal ends a decoupled request's stream after the response it sent."""
    with requests.post(url(server, "reschedule_not_iterative_decoupled", "generate_stream"),
                       json={"IN": 3}, stream=True, timeout=60) as reply:
        body = reply.text
    assert '"OUT":2' in body.replace(" ", "")
    assert messages.RESCHEDULE_NOT_CONFIGURED in body


def test_implicit_state_input_carries_the_initial_state(client: Client) -> None:
    """Triton docs "Implicit State Management" and core sequence_state.cc: every request of
    a sequence gets the state's input_name tensor, set up at START from initial_state
    (here data_file initial_state/seven.bin). The python backend never calls
    TRITONBACKEND_StateUpdate, so a python model sees that initial state on every request."""
    sequence = new_sequence()
    seen = [step(client, sequence, value, start=value == 1, end=value == 3,
                 model="sequence_state")[1] for value in (1, 2, 3)]
    assert [s["controls"] for s in seen] == [{"IN_STATE": 7}] * 3


# -- the oldest strategy -------------------------------------------------------------------
def oldest_batches(record_dir: Path, ids: set[str], model: str = "sequence_oldest"
                   ) -> list[list[str]]:
    """The batches ``model`` executed that hold any of ``ids``, in order."""
    path = record_dir / f"{model}.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [row["ids"] for row in rows
            if row["event"] == "execute" and ids.intersection(row["ids"])]


def oldest_step(protocol: str, server: TritiumProcess, sequence: int, name: str,
                start: bool = False, end: bool = False, model: str = "sequence_oldest") -> None:
    # A client of its own: tritonclient.http sends one request at a time per client.
    client = Client(protocol, server)
    try:
        client.infer(model, {"INPUT0": np.zeros((1, 1), np.float32)},
                     request_id=name, sequence_id=sequence, sequence_start=start,
                     sequence_end=end)
    finally:
        client.raw.close()


def test_oldest_batches_requests_of_different_sequences(client: Client, server: TritiumProcess,
                                                        record_dir: Path) -> None:
    """Triton docs "Oldest" (OldestSequenceBatch): each sequence keeps to one instance, and
    the dynamic batcher batches requests of different sequences together, here up to the
    preferred batch size 4 (the direct strategy would run them one per execute)."""
    sequences = [new_sequence() for _ in range(4)]
    names: set[str] = set()
    for step_no in (1, 2):
        with ThreadPoolExecutor(4) as pool:
            futures = []
            for sequence in sequences:
                name = f"{sequence}-{step_no}"
                names.add(name)
                futures.append(pool.submit(oldest_step, client.protocol, server, sequence,
                                           name, step_no == 1, step_no == 2))
            for future in futures:
                future.result(timeout=60)
    got = oldest_batches(record_dir, names)
    assert [sorted(batch) for batch in got] == [
        sorted(f"{s}-1" for s in sequences), sorted(f"{s}-2" for s in sequences)]


def test_oldest_issues_one_request_of_a_sequence_at_a_time(server: TritiumProcess,
                                                           record_dir: Path) -> None:
    """OldestSequenceBatch issues a sequence's next request to the batcher only once the
    one before it completed: a stream that sends A1 B1 C1 D1 A2 B2 C2 D2 in order gets two
    batches, never A1 and A2 together."""
    sequences = [new_sequence() for _ in range(4)]
    order = [(s, n) for n in (1, 2) for s in sequences]
    results: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as raw:
        raw.start_stream(lambda result, error: results.put(error or result))
        for sequence, step_no in order:
            tensor = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
            tensor.set_data_from_numpy(np.zeros((1, 1), np.float32))
            raw.async_stream_infer("sequence_oldest", [tensor], request_id=f"{sequence}-{step_no}",
                                   sequence_id=sequence, sequence_start=step_no == 1,
                                   sequence_end=step_no == 2)
        answers = [results.get(timeout=60) for _ in order]
        raw.stop_stream()
    assert not [a for a in answers if isinstance(a, Exception)]
    got = oldest_batches(record_dir, {f"{s}-{n}" for s, n in order})
    assert got == [[f"{s}-1" for s in sequences], [f"{s}-2" for s in sequences]]


def test_a_sequence_past_max_candidate_sequences_waits_for_one_to_end(
        client: Client, server: TritiumProcess, record_dir: Path) -> None:
    """Triton docs "Oldest": with no room for another candidate sequence on any instance
    (``max_candidate_sequences: 1``) a new sequence waits in the backlog, and runs once a
    sequence ends."""
    model = "sequence_oldest_one"
    first, second = new_sequence(), new_sequence()
    names = {f"{first}-1", f"{first}-2", f"{second}-1", f"{second}-2"}
    oldest_step(client.protocol, server, first, f"{first}-1", start=True, model=model)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(oldest_step, client.protocol, server, second, f"{second}-1",
                              True, False, model)
        wait_for_metric(server.metrics_url, PENDING, 1, timeout=30, model=model)
        assert not waiting.done()
        oldest_step(client.protocol, server, first, f"{first}-2", end=True, model=model)
        waiting.result(timeout=60)
    oldest_step(client.protocol, server, second, f"{second}-2", end=True, model=model)
    got = [sorted(batch) for batch in oldest_batches(record_dir, names, model)]
    ran = {name: n for n, batch in enumerate(got) for name in batch}
    assert ran[f"{second}-1"] >= ran[f"{first}-2"] > ran[f"{first}-1"], got


def test_a_backlogged_sequence_is_rejected_once_its_timeout_passes(
        client: Client, server: TritiumProcess, record_dir: Path) -> None:
    """Triton's sequence batcher (schedule-policy extension, "timeout"): a request's timeout
    bounds how long its sequence waits in the backlog; past it the sequence is ended and its
    requests are answered UNAVAILABLE, counted REJECTED. The sequence that holds the
    instance is not bounded by it, and the ended one needs START again."""
    model = "sequence_oldest_one"
    first, second = new_sequence(), new_sequence()
    failures = "nv_inference_request_failure"
    rejected = metric(server.metrics_url, failures, model=model, reason="REJECTED")
    oldest_step(client.protocol, server, first, f"{first}-1", start=True, model=model)
    zeros = {"INPUT0": np.zeros((1, 1), np.float32)}
    error = client.failure(lambda: client.infer(model, zeros, request_id=f"{second}-1",
                                                sequence_id=second, sequence_start=True,
                                                timeout=200_000))
    assert error.status() == client.status("UNAVAILABLE")
    assert "timeout of the corresponding sequence has been expired" in error.message()
    wait_for_metric(server.metrics_url, failures, rejected + 1, model=model, reason="REJECTED")
    error = client.failure(lambda: client.infer(model, zeros, sequence_id=second,
                                                sequence_end=True))
    assert "must specify the START flag" in error.message()
    oldest_step(client.protocol, server, first, f"{first}-2", end=True, model=model)
    got = oldest_batches(record_dir, {f"{first}-1", f"{first}-2", f"{second}-1"}, model)
    assert got == [[f"{first}-1"], [f"{first}-2"]]
