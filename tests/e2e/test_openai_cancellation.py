"""A client leaving an OpenAI request cancels it, as it cancels /generate: the model sees
is_cancelled() within the same bound (STOP_BOUND_S), the cancellation metric counts it, and a
request still queued never runs. Clients here are raw sockets closed with FIN or RST."""

from __future__ import annotations

import json
import signal
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.e2e.leaving import (
    assert_stopped_soon,
    cancel_line,
    cancellations,
    new_id,
    wait_for_cancellations,
)
from tests.e2e.leaving_http import close, read_response
from tests.e2e.observe import Records, metric, wait_for_metric, wait_until
from tests.e2e.openai_models import (
    RECORD_FILE,
    base_url,
    build_openai_repository,
    openai_records,
    openai_server,
)
from tests.server_process import TritiumProcess

__all__ = ["openai_records", "openai_server"]  # fixtures

# Words the text models send at 20 ms each: only a cancel ends the work in a test's time.
LONG = 1500
HOWS = [False, True]
HOW_IDS = ["fin", "rst"]


def raw_request(path: str, body: dict[str, Any], request_id: str) -> bytes:
    data = json.dumps(body).encode()
    return (f"POST /v1/{path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            f"X-Request-Id: {request_id}\r\nContent-Length: {len(data)}\r\n\r\n"
            ).encode() + data


def completion(model: str, stream: bool, max_tokens: int = LONG) -> dict[str, Any]:
    return {"model": model, "prompt": "a b c", "max_tokens": max_tokens, "stream": stream}


def chat(model: str, stream: bool) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": LONG, "stream": stream}


def send(server: TritiumProcess, path: str, body: dict[str, Any], request_id: str
         ) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
    sock.sendall(raw_request(path, body, request_id))
    return sock


def read_first_event(sock: socket.socket) -> bytes:
    """Bytes up to the first server-sent event with text: the model is generating."""
    data = b""
    while b'"text":"a ' not in data and b'"content":"' not in data.replace(
            b'"content":""', b""):
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before the first event: {data!r}"
        data += chunk
    assert data.startswith(b"HTTP/1.1 200"), data
    return data


def records(openai_records: Path) -> Records:
    return Records(openai_records / RECORD_FILE)


def leave_and_check(server: TritiumProcess, recorded: Records, sock: socket.socket,
                    request_id: str, model: str, reset: bool) -> None:
    before = cancellations(server, model, "CLIENT_DISCONNECTED", "executing")
    left = openai_requests(server, model, "cancelled")
    left_at = time.monotonic()
    close(sock, reset)
    assert_stopped_soon(recorded, request_id, left_at)
    server.wait_for_line(cancel_line(request_id, model, "executing"))
    wait_for_cancellations(server, model, "CLIENT_DISCONNECTED", "executing", before + 1)
    wait_until(lambda: openai_requests(server, model, "cancelled") == left + 1,
               "the OpenAI request counted as cancelled")


def openai_requests(server: TritiumProcess, model: str, outcome: str) -> float:
    """OpenAI requests to ``model`` that ended with ``outcome``, both endpoints."""
    return sum(metric(server.metrics_url, "tritium_openai_request", model=model,
                      endpoint=endpoint, outcome=outcome)
               for endpoint in ("completions", "chat_completions"))


@pytest.mark.parametrize("reset", HOWS, ids=HOW_IDS)
@pytest.mark.parametrize(("path", "model"), [("completions", "text_stream"),
                                             ("completions", "text_words"),
                                             ("chat/completions", "text_stream")])
def test_leaving_a_stream_cancels_it(openai_server: TritiumProcess, openai_records: Path,
                                     path: str, model: str, reset: bool) -> None:
    """Streamed from a decoupled model (one event per word) or a non-decoupled one (one
    event at the end, so the client leaves while waiting for it)."""
    recorded, rid = records(openai_records), new_id()
    body = completion(model, True) if path == "completions" else chat(model, True)
    sock = send(openai_server, path, body, rid)
    if model == "text_stream":
        read_first_event(sock)
    else:
        recorded.wait_for(rid, "start")
    leave_and_check(openai_server, recorded, sock, rid, model, reset)


@pytest.mark.parametrize("reset", HOWS, ids=HOW_IDS)
@pytest.mark.parametrize(("path", "model"), [("completions", "text_words"),
                                             ("completions", "text_stream"),
                                             ("chat/completions", "text_words")])
def test_leaving_while_waiting_cancels_it(openai_server: TritiumProcess,
                                          openai_records: Path, path: str, model: str,
                                          reset: bool) -> None:
    recorded, rid = records(openai_records), new_id()
    body = completion(model, False) if path == "completions" else chat(model, False)
    sock = send(openai_server, path, body, rid)
    recorded.wait_for(rid, "start")
    leave_and_check(openai_server, recorded, sock, rid, model, reset)


def test_leaving_a_streamed_bls_chat_stops_the_engine(openai_server: TritiumProcess) -> None:
    """llm forwards to token_engine with the same request id and cancellation; the engine
    logs how far it got when it stops."""
    rid = new_id()
    start = len(openai_server.lines)
    sock = send(openai_server, "chat/completions", chat("llm", True), rid)
    read_first_event(sock)
    left_at = time.monotonic()
    close(sock)
    line = openai_server.wait_for_line(f"token_engine: request '{rid}' cancelled after",
                                       timeout=10, start=start)
    assert time.monotonic() - left_at < 10
    assert f"of {LONG} tokens" in line


@contextmanager
def holding_queue(server: TritiumProcess, recorded: Records) -> Iterator[list[str]]:
    """text_queue's one instance busy, its one queue slot taken: [executing, queued] ids.
    Both clients leave at the end; the queued one is removed before it runs."""
    held, queued = new_id(), new_id()
    first = send(server, "completions", completion("text_queue", False), held)
    recorded.wait_for(held, "start")
    before = cancellations(server, "text_queue", "CLIENT_DISCONNECTED", "queued")
    second = send(server, "completions", completion("text_queue", False), queued)
    try:
        wait_for_metric(server.metrics_url, "nv_inference_pending_request_count", 1,
                        model="text_queue")
        yield [held, queued]
    finally:
        close(second)
        server.wait_for_line(cancel_line(queued, "text_queue", "queued"))
        wait_for_cancellations(server, "text_queue", "CLIENT_DISCONNECTED", "queued",
                               before + 1)
        close(first)
        recorded.wait_for(held, "cancelled")


def test_queued_request_left_by_its_client_never_runs(openai_server: TritiumProcess,
                                                      openai_records: Path) -> None:
    recorded = records(openai_records)
    with holding_queue(openai_server, recorded) as (_, queued):
        pass
    # The next request runs on the freed instance; a leaked queued one would run first.
    marker = new_id()
    sock = send(openai_server, "completions", completion("text_queue", False, 1), marker)
    head, content = read_response(sock)
    assert b"\"text\":\"a \"" in content, content
    sock.close()
    assert head.startswith(b"HTTP/1.1 200"), head
    assert recorded.events(marker) == ["start", "done"]
    assert recorded.events(queued) == []


def test_full_queue_is_rate_limited(openai_server: TritiumProcess,
                                    openai_records: Path) -> None:
    """A full queue is Triton's UNAVAILABLE "Exceeds maximum queue size": OpenAI's 429, so
    the SDK raises RateLimitError (and would retry it)."""
    with holding_queue(openai_server, records(openai_records)), openai.OpenAI(
            base_url=base_url(openai_server), api_key="unused", max_retries=0) as client:
        errors = openai_requests(openai_server, "text_queue", "error")
        with pytest.raises(openai.RateLimitError) as caught:
            client.completions.create(model="text_queue", prompt="x", max_tokens=1)
        assert "queue" in caught.value.message
        assert openai_requests(openai_server, "text_queue", "error") == errors + 1



def test_shutting_down_is_service_unavailable(tmp_path: Path) -> None:
    """While the server drains, a new request gets Triton's UNAVAILABLE "shutting down": in
    OpenAI's shape that is a 503, which the SDK raises as InternalServerError."""
    repo = build_openai_repository(tmp_path / "repo", tmp_path)
    server = TritiumProcess(repo, "--exit-timeout-secs", "30").start()
    try:
        holder = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
        holder.sendall(raw_request("completions", completion("text_stream", True), new_id()))
        assert holder.recv(4096).startswith(b"HTTP/1.1 200")  # the drain waits for it
        server.signal(signal.SIGTERM)
        server.wait_for_line("shutting down")
        with openai.OpenAI(base_url=base_url(server), api_key="unused",
                           max_retries=0) as client, \
                pytest.raises(openai.InternalServerError) as caught:
            client.completions.create(model="text_echo", prompt="x", max_tokens=1)
        assert caught.value.status_code == 503
        assert "shutting down" in caught.value.message
        body = caught.value.body
        assert isinstance(body, dict) and body.get("type") and body.get("message")
        holder.close()  # the one request in flight leaves; the drain is over
        assert server.wait(30) == 0, server.log()
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.stop()
