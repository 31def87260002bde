"""Decoupled models, /generate and /generate_stream, async execute and BLS over HTTP."""

from __future__ import annotations

import itertools
import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.server_process import TritiumProcess


def url(server: TritiumProcess, model: str, endpoint: str) -> str:
    return f"http://{server.http_url}/v2/models/{model}/{endpoint}"


def sse_events(reply: requests.Response) -> list[tuple[float, dict[str, Any]]]:
    """Each SSE event with the moment it arrived."""
    events = []
    buffer = b""
    for chunk in reply.iter_content(chunk_size=None):
        buffer += chunk
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            assert event.startswith(b"data: "), event
            events.append((time.monotonic(), json.loads(event[len(b"data: "):])))
    assert buffer == b""
    return events


def test_generate_stream_delivers_each_response_as_it_is_sent(server: TritiumProcess) -> None:
    body = {"INPUT0": 5, "DELAY": 150}
    with requests.post(url(server, "repeat", "generate_stream"), json=body, stream=True,
                       timeout=30) as reply:
        assert reply.status_code == 200
        assert reply.headers["Content-Type"].startswith("text/event-stream")
        events = sse_events(reply)
    assert [e["OUTPUT0"] for _, e in events] == [0, 1, 2, 3, 4]
    assert all(e["model_name"] == "repeat" for _, e in events)
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(events)]
    # Buffering would deliver everything at once; streaming spaces events by the model's delay.
    assert min(gaps) > 0.07, gaps


def test_generate_on_a_plain_model(server: TritiumProcess) -> None:
    reply = requests.post(url(server, "identity_fp32", "generate"),
                          json={"INPUT0": [1.5, 2.5], "id": "g1", "custom": 3}, timeout=30)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body == {"model_name": "identity_fp32", "model_version": "1", "id": "g1",
                    "OUTPUT0": [1.5, 2.5]}


def test_generate_on_a_decoupled_model_with_one_response(server: TritiumProcess) -> None:
    reply = requests.post(url(server, "llm", "generate"),
                          json={"text_input": "alpha beta", "max_tokens": 3, "stream": False},
                          timeout=30)
    assert reply.status_code == 200, reply.text
    assert reply.json()["text_output"] == "alpha beta alpha "


def test_generate_stream_through_bls_front_model(server: TritiumProcess) -> None:
    body = {"text_input": "one two", "max_tokens": 4, "stream": True}
    with requests.post(url(server, "llm", "generate_stream"), json=body, stream=True,
                       timeout=30) as reply:
        events = sse_events(reply)
    assert [e["text_output"] for _, e in events] == ["one ", "two ", "one ", "two "]


def test_bls_front_model_streams_tokens_as_the_engine_makes_them(server: TritiumProcess) -> None:
    body = {"text_input": "a b", "max_tokens": 12, "stream": True}
    with requests.post(url(server, "llm", "generate_stream"), json=body, stream=True,
                       timeout=30) as reply:
        events = sse_events(reply)
    assert len(events) == 12
    # 20 ms per token: relayed one by one, the first arrives long before the last.
    assert events[-1][0] - events[0][0] > 0.15


def test_generate_refuses_many_responses(server: TritiumProcess) -> None:
    reply = requests.post(url(server, "repeat", "generate"), json={"INPUT0": 3}, timeout=30)
    assert reply.status_code >= 400
    assert "single response" in reply.json()["error"] or "exactly 1" in reply.json()["error"]


def test_generate_stream_error_is_sse_framed(server: TritiumProcess) -> None:
    with requests.post(url(server, "raises", "generate_stream"), json={"INPUT0": [1.0]},
                       stream=True, timeout=30) as reply:
        assert reply.status_code == 500
        assert reply.headers["Content-Type"].startswith("text/event-stream")
        events = sse_events(reply)
    assert len(events) == 1
    assert "this model always fails" in events[0][1]["error"]


def test_generate_conversion_error_is_plain_json(server: TritiumProcess) -> None:
    reply = requests.post(url(server, "add_sub", "generate"), json={"INPUT0": [1, 2]}, timeout=30)
    assert reply.status_code == 400
    assert reply.headers["Content-Type"] == "application/json"
    assert reply.json()["error"]


def test_decoupled_model_refused_on_infer(server: TritiumProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("INPUT0", [1], "INT32")
    tensor.set_data_from_numpy(np.array([2], dtype=np.int32))
    with pytest.raises(InferenceServerException) as caught:
        client.infer("repeat", [tensor])
    assert caught.value.status() == "501"
    assert "decoupled" in caught.value.message()


def test_async_decoupled_model_overlaps_requests(server: TritiumProcess) -> None:
    def call(_: int) -> list[float]:
        reply = requests.post(url(server, "async_decoupled", "generate"), json={"INPUT0": 0.6},
                              timeout=30)
        assert reply.status_code == 200, reply.text
        return list(reply.json()["OUTPUT0"])

    with ThreadPoolExecutor(3) as pool:
        spans = list(pool.map(call, range(3)))
    latest_start = max(start for start, _ in spans)
    earliest_end = min(end for _, end in spans)
    assert latest_start < earliest_end, spans  # all three were sleeping at once


def _bls(server: TritiumProcess, mode: str, data: list[float]) -> requests.Response:
    return requests.post(url(server, "bls", "generate"), json={"MODE": mode, "INPUT0": data},
                         timeout=30)


def test_bls_exec(server: TritiumProcess) -> None:
    reply = _bls(server, "exec", [1.0, 2.0, 3.0])
    assert reply.status_code == 200, reply.text
    assert reply.json()["OUTPUT0"] == [1.0, 2.0, 3.0]


def test_bls_decoupled_exec(server: TritiumProcess) -> None:
    reply = _bls(server, "decoupled", [5.0])
    assert reply.status_code == 200, reply.text
    assert reply.json()["OUTPUT0"] == 10.0  # 0 + 1 + 2 + 3 + 4


def test_bls_child_error_surfaces_in_parent(server: TritiumProcess) -> None:
    reply = _bls(server, "error", [1.0])
    assert reply.status_code == 500
    assert "this model always fails" in reply.json()["error"]


def test_bls_async_exec(server: TritiumProcess) -> None:
    reply = requests.post(url(server, "bls_async", "generate"), json={"INPUT0": [1.0, 4.0]},
                          timeout=30)
    assert reply.status_code == 200, reply.text
    assert reply.json()["OUTPUT0"] == [2.0, 8.0]


@pytest.mark.parametrize("endpoint", ["generate", "generate_stream"])
@pytest.mark.parametrize("body, repeated", [
    ('{"text_input": "a", "stream": false, "text_input": "b"}', "text_input"),
    ('{"text_input": "a", "stream": false, "stream": true, "text_input": "b"}', "stream"),
])
def test_generate_refuses_an_input_given_twice(server: TritiumProcess, endpoint: str,
                                               body: str, repeated: str) -> None:
    """Triton's generate endpoint test sends such bodies as raw text and expects a JSON
    error naming the first repeated input ("input '<name>' already exists in request"),
    on both endpoints, before any response is streamed."""
    reply = requests.post(url(server, "llm", endpoint), data=body, timeout=30)
    assert reply.status_code == 400
    assert reply.headers["Content-Type"] == "application/json"
    assert f"input '{repeated}' already exists in request" in reply.json()["error"]
