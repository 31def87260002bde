"""--rate-limit execution_count: instances run as their groups' rate_limiter resources and
priorities allow, across models; with --rate-limit off the section is ignored, as Triton."""

from __future__ import annotations

import itertools
import queue
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.leaving import PENDING, http_raw_request, new_id
from tests.e2e.leaving_grpc import client_inputs
from tests.e2e.observe import Records, metric, wait_for_metric
from tests.server_process import TritiumProcess
from tests.zoo import _parameter, _tensor, add_model

IO = _tensor("input", "INPUT0", "FP32", "1") + _tensor("output", "OUTPUT0", "FP32", "1")
BIG_NEED = ('Resource count for "R" is limited to 1 which will prevent scheduling of one or '
            "more model instances, the minimum required count is 5")


def _slow(repo: Path, name: str, records: Path, group: str) -> None:
    add_model(repo, name, "slow", IO + _parameter("record_file", str(records))
              + f"instance_group [{{ kind: KIND_CPU {group} }}]\n")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("rate_limited")
    shared = repo.parent / f"{repo.name}_shared.jsonl"
    ordered = repo.parent / f"{repo.name}_ordered.jsonl"
    needs_r = 'rate_limiter { resources [ { name: "R" count: 1 } ] }'
    # Two models of two instances each, sharing one R: one execution at a time in all.
    for name in ("share_a", "share_b"):
        _slow(repo, name, shared, f"count: 2 {needs_r}")
    # "hold" takes P so that "high" and "low" queue up behind it, then compete for it.
    _slow(repo, "hold", ordered, 'count: 1 rate_limiter { resources [ { name: "P" count: 1 } ] }')
    _slow(repo, "high", ordered,
          'count: 1 rate_limiter { resources [ { name: "P" count: 1 } ] priority: 1 }')
    _slow(repo, "low", ordered,
          'count: 1 rate_limiter { resources [ { name: "P" count: 1 } ] priority: 4 }')
    _slow(repo, "big", shared, 'count: 1 rate_limiter { resources [ { name: "R" count: 5 } ] }')
    return repo


@pytest.fixture(scope="module")
def limited(repo: Path) -> Iterator[TritiumProcess]:
    process = TritiumProcess(repo, "--rate-limit", "execution_count",
                             "--rate-limit-resource=R:1", "--rate-limit-resource", "P:1:0"
                             ).start(timeout=120)
    yield process
    assert process.stop() == 0, process.log()


@pytest.fixture(scope="module")
def unlimited(repo: Path) -> Iterator[TritiumProcess]:
    process = TritiumProcess(repo, "--rate-limit", "off",
                             "--rate-limit-resource=R:1").start(timeout=120)
    yield process
    assert process.stop() == 0, process.log()


def records(repo: Path, which: str) -> Records:
    return Records(repo.parent / f"{repo.name}_{which}.jsonl")


def run_all(server: TritiumProcess, protocol: str, work: list[tuple[str, str, float]]) -> None:
    """Send every (model, request id, seconds) at once; wait for every answer."""
    if protocol == "http":
        client: Any = httpclient.InferenceServerClient(server.http_url,
                                                       concurrency=len(work))
        pending = []
        for model, rid, seconds in work:
            inputs = [httpclient.InferInput("INPUT0", [1], "FP32")]
            inputs[0].set_data_from_numpy(np.array([seconds], dtype=np.float32))
            pending.append(client.async_infer(model, inputs, request_id=rid))
        for result in pending:
            result.get_result(timeout=60)
        client.close()
        return
    answers: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as grpc:
        for model, rid, seconds in work:
            grpc.async_infer(model, client_inputs({"INPUT0": seconds}),
                             lambda result, error: answers.put(error), request_id=rid)
        errors = [answers.get(timeout=60) for _ in work]
    assert errors == [None] * len(work)


def intervals(recorded: Records, ids: list[str]) -> list[tuple[float, float]]:
    return sorted((recorded.times(rid, "start")[0], recorded.times(rid, "done")[0])
                  for rid in ids)


def overlapping(spans: list[tuple[float, float]]) -> int:
    return sum(1 for (_, end), (start, _) in itertools.pairwise(spans) if start < end)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_models_sharing_one_resource_never_run_at_once(limited: TritiumProcess, repo: Path,
                                                      protocol: str) -> None:
    work = [(model, new_id(), 0.1) for model in ("share_a", "share_b") for _ in range(3)]
    run_all(limited, protocol, work)
    spans = intervals(records(repo, "shared"), [rid for _, rid, _ in work])
    assert overlapping(spans) == 0, spans


def test_off_ignores_the_rate_limiter_section(unlimited: TritiumProcess, repo: Path) -> None:
    work = [(model, new_id(), 0.3) for model in ("share_a", "share_b") for _ in range(2)]
    run_all(unlimited, "grpc", work)
    spans = intervals(records(repo, "shared"), [rid for _, rid, _ in work])
    assert overlapping(spans) > 0, spans  # four instances, nothing shared
    # "big" needs more R than --rate-limit-resource gives, which only the limiter checks.
    assert httpclient.InferenceServerClient(unlimited.http_url).is_model_ready("big")


def _send_raw(server: TritiumProcess, model: str, rid: str, seconds: float) -> socket.socket:
    """``model`` asked to work ``seconds`` over a raw HTTP connection: closing it leaves."""
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
    body = f'{{"id": "{rid}", "INPUT0": {seconds}}}'.encode()
    sock.sendall(http_raw_request(model, "generate", body))
    return sock


def _hold(server: TritiumProcess, recorded: Records) -> tuple[str, socket.socket]:
    """A request of "hold" running, holding P until its connection closes."""
    rid = new_id()
    sock = _send_raw(server, "hold", rid, 60.0)
    recorded.wait_for(rid, "start")
    return rid, sock


def _let_go(recorded: Records, hold: tuple[str, socket.socket]) -> None:
    rid, sock = hold
    sock.close()
    recorded.wait_for(rid, "cancelled")


def test_priority_weighting_orders_the_waiting_instances(limited: TritiumProcess,
                                                         repo: Path) -> None:
    ordered = records(repo, "ordered")
    hold = _hold(limited, ordered)
    work = [(model, new_id(), 0.02) for _ in range(6) for model in ("high", "low")]
    done = threading.Thread(target=run_all, args=(limited, "grpc", work))
    done.start()
    # One request of each is staged (it left the queue), the others queue behind it.
    for model in ("high", "low"):
        wait_for_metric(limited.metrics_url, PENDING, 5, model=model)
    _let_go(ordered, hold)
    done.join(timeout=60)
    starts = sorted((ordered.times(rid, "start")[0], model) for model, rid, _ in work)
    order = [model for _, model in starts]
    # The first of each ran once; then "high" (priority 1) runs until its runs x 1 catch
    # up with "low"'s 1 x 4, then "low" (staged earlier) wins the tie.
    assert sorted(order[:2]) == ["high", "low"], order
    assert order[2:6] == ["high", "high", "high", "low"], order


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_model_needing_more_than_given_fails_to_load(limited: TritiumProcess,
                                                       protocol: str) -> None:
    if protocol == "http":
        client: Any = httpclient.InferenceServerClient(limited.http_url)
        rows = client.get_model_repository_index()
    else:
        client = grpcclient.InferenceServerClient(limited.grpc_url)
        rows = client.get_model_repository_index(as_json=True)["models"]
    found = {r["name"]: (r.get("state"), r.get("reason", "")) for r in rows}
    assert found["big"][0] == "UNAVAILABLE" and BIG_NEED in found["big"][1], found["big"]
    assert not client.is_model_ready("big") and client.is_model_ready("share_a")
    client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_requests_waiting_for_a_resource_are_cancelled_when_their_client_leaves(
        limited: TritiumProcess, repo: Path, protocol: str) -> None:
    ordered = records(repo, "ordered")
    hold = _hold(limited, ordered)
    # Two requests for "high" while "hold" has P: one is staged (its instance waits for P),
    # the other queues behind it.
    ids = [new_id(), new_id()]
    socks: list[socket.socket] = []
    errors: queue.Queue[Any] = queue.Queue()
    grpc = grpcclient.InferenceServerClient(limited.grpc_url)
    for rid in ids:
        if protocol == "http":
            socks.append(_send_raw(limited, "high", rid, 0.01))
        else:  # the client leaves at its deadline
            grpc.async_infer("high", client_inputs({"INPUT0": 0.01}),
                             lambda result, error: errors.put(error), request_id=rid,
                             client_timeout=1.0)
    wait_for_metric(limited.metrics_url, PENDING, 1, model="high")
    for sock in socks:
        sock.close()
    stages = []
    for rid in ids:
        line = limited.wait_for_line(f"request {rid} for model 'high' version 1 cancelled while")
        stages.append(line.split(" cancelled while ")[1].split(":")[0])
    # A staged request has left the queue, as a Triton payload has: it counts as executing.
    assert sorted(stages) == ["executing", "queued"], stages
    assert ordered.events(hold[0]) == ["start"]  # answered while P was still held
    if protocol == "grpc":
        statuses = [errors.get(timeout=10).status() for _ in ids]
        assert statuses == ["StatusCode.DEADLINE_EXCEEDED"] * 2
    _let_go(ordered, hold)
    # The model never saw them, and P came back: "high" still runs.
    after = new_id()
    run_all(limited, "grpc", [("high", after, 0.01)])
    assert [ordered.events(rid) for rid in ids] == [[], []]
    assert ordered.events(after) == ["start", "done"]
    assert metric(limited.metrics_url, PENDING, model="high") == 0
    grpc.close()
