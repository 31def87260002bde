"""Byte-level tests of the HTTP/1.1 transport: over raw loopback sockets on asyncio and uvloop,
and driven with bytes alone where a bound is judged."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import socket
import struct
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import pytest
import uvloop

from tritium.frontends.http.connection import HttpConnection
from tritium.frontends.http.exchange import App, HttpExchange, HttpRequest
from tritium.frontends.http.limits import HttpLimits
from tritium.frontends.http.pacing import LINGER_S, Pacing
from tritium.frontends.http.transport import HttpServer, OpenConnections, start_http_server

BOUND_S = 5.0  # generous: a wait that hits it means the behaviour is missing
Runner = Callable[[Coroutine[Any, Any, None]], None]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Runner:
    factory = uvloop.new_event_loop if request.param == "uvloop" else asyncio.new_event_loop

    def runner(coro: Coroutine[Any, Any, None]) -> None:
        with asyncio.Runner(loop_factory=factory, debug=True) as loop_runner:
            loop_runner.run(coro)

    return runner


@contextlib.asynccontextmanager
async def serving(app: App, **limits: Any) -> AsyncIterator[HttpServer]:
    server = await start_http_server(app, "127.0.0.1", 0, HttpLimits(**limits))
    try:
        yield server
    finally:
        server.close()
        server.close_idle_connections()
        await bounded(server.wait_closed())


async def bounded(awaitable: Awaitable[Any]) -> Any:
    return await asyncio.wait_for(awaitable, BOUND_S)


async def connect(server: HttpServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", server.port)


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


async def read_response(reader: asyncio.StreamReader) -> Response:
    head = await bounded(reader.readuntil(b"\r\n\r\n"))
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:-2]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        body = await bounded(reader.readexactly(int(headers["content-length"])))
    elif headers.get("transfer-encoding") == "chunked":
        body = await read_chunked(reader)
    else:
        body = await bounded(reader.read())
    return Response(status, headers, body)


async def read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size = int(await bounded(reader.readuntil(b"\r\n")), 16)
        data = await bounded(reader.readexactly(size + 2))
        if size == 0:
            return b"".join(parts)
        parts.append(data[:-2])


def request_bytes(path: str = "/", body: bytes = b"", extra: str = "",
                  version: str = "1.1") -> bytes:
    length = f"Content-Length: {len(body)}\r\n" if body else ""
    return f"POST {path} HTTP/{version}\r\nHost: t\r\n{length}{extra}\r\n".encode() + body


async def echo(exchange: HttpExchange) -> None:
    request = exchange.request
    exchange.respond(200, [("Content-Type", "text/plain"), ("X-Path", request.path)],
                     request.body or request.method.encode())


async def assert_closed(reader: asyncio.StreamReader) -> None:
    assert await bounded(reader.read()) == b""


def test_keep_alive_serves_several_requests_on_one_connection(run: Runner) -> None:
    async def scenario() -> None:
        async with serving(echo) as server:
            reader, writer = await connect(server)
            for i in range(3):
                writer.write(request_bytes(f"/r{i}", f"body {i}".encode()))
                response = await read_response(reader)
                assert (response.status, response.body) == (200, f"body {i}".encode())
                assert response.headers["x-path"] == f"/r{i}"
                assert response.headers["content-length"] == str(len(response.body))
                assert "connection" not in response.headers
            assert server.active_connections() == 1
            writer.close()

    run(scenario())


def test_connection_close_is_echoed_and_the_socket_closes(run: Runner) -> None:
    async def scenario() -> None:
        async with serving(echo) as server:
            reader, writer = await connect(server)
            writer.write(request_bytes(extra="Connection: close\r\n") + request_bytes("/late"))
            response = await read_response(reader)
            assert response.headers["connection"] == "close"
            await assert_closed(reader)  # the pipelined request after it is not answered
            writer.close()

    run(scenario())


@pytest.mark.parametrize(
    ("extra", "stays_open"), [("", False), ("Connection: keep-alive\r\n", True)]
)
def test_http10_closes_unless_keep_alive_is_asked_for(
    run: Runner, extra: str, stays_open: bool
) -> None:
    async def scenario() -> None:
        async with serving(echo) as server:
            reader, writer = await connect(server)
            writer.write(request_bytes(body=b"x", extra=extra, version="1.0"))
            response = await read_response(reader)
            assert response.body == b"x"
            if stays_open:
                assert response.headers["connection"] == "keep-alive"
                writer.write(request_bytes(body=b"y", extra=extra, version="1.0"))
                assert (await read_response(reader)).body == b"y"
            else:
                assert response.headers["connection"] == "close"
                await assert_closed(reader)
            writer.close()

    run(scenario())


def test_request_fields(run: Runner) -> None:
    seen: list[HttpRequest] = []

    async def app(exchange: HttpExchange) -> None:
        seen.append(exchange.request)
        exchange.respond(200, [])

    async def scenario() -> None:
        async with serving(app) as server:
            reader, writer = await connect(server)
            writer.write(b"GET /v2/models/a%20b?x=1&y=2 HTTP/1.1\r\nHost: t\r\n"
                         b"X-Multi: one\r\nx-multi: two\r\n\r\n")
            response = await read_response(reader)
            assert (response.status, response.body) == (200, b"")
            writer.close()

    run(scenario())
    (request,) = seen
    assert (request.method, request.path, request.query) == ("GET", "/v2/models/a%20b", "x=1&y=2")
    assert request.headers == {"host": "t", "x-multi": "one, two"}
    assert (request.body, request.http_version, request.keep_alive) == (b"", "1.1", True)


def test_pipelined_requests_are_served_one_after_another_in_order(run: Runner) -> None:
    calls: list[tuple[str, bool]] = []
    in_app = 0
    most_in_app = 0

    async def app(exchange: HttpExchange) -> None:
        nonlocal in_app, most_in_app
        in_app += 1
        most_in_app = max(most_in_app, in_app)
        previous_done = all(e.responded for e in finished)
        calls.append((exchange.request.path, previous_done))
        await asyncio.sleep(0)  # let the transport try (wrongly) to start the next one
        await echo(exchange)
        finished.append(exchange)
        in_app -= 1

    finished: list[HttpExchange] = []

    async def scenario() -> None:
        async with serving(app) as server:
            reader, writer = await connect(server)
            writer.write(b"".join(request_bytes(f"/{i}", f"{i}".encode()) for i in range(5)))
            bodies = [(await read_response(reader)).body for _ in range(5)]
            assert bodies == [b"0", b"1", b"2", b"3", b"4"]
            writer.close()

    run(scenario())
    assert calls == [(f"/{i}", True) for i in range(5)]
    assert most_in_app == 1


def test_chunked_body_with_trailers_is_dechunked(run: Runner) -> None:
    async def scenario() -> None:
        async with serving(echo) as server:
            reader, writer = await connect(server)
            writer.write(b"POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                         b"5\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n")
            assert (await read_response(reader)).body == b"hello world"
            writer.write(request_bytes(body=b"again"))
            assert (await read_response(reader)).body == b"again"
            writer.close()

    run(scenario())


def test_expect_continue_gets_an_interim_response_before_the_body(run: Runner) -> None:
    async def scenario() -> None:
        async with serving(echo) as server:
            reader, writer = await connect(server)
            writer.write(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n"
                         b"Expect: 100-continue\r\n\r\n")
            interim = b"HTTP/1.1 100 Continue\r\n\r\n"
            assert await bounded(reader.readexactly(len(interim))) == interim
            writer.write(b"hello")
            assert (await read_response(reader)).body == b"hello"
            writer.close()

    run(scenario())


def assert_json_error(response: Response, status: int, fragment: str) -> None:
    assert response.status == status
    assert response.headers["content-type"] == "application/json"
    assert response.headers["connection"] == "close"
    assert fragment in json.loads(response.body)["error"]


def test_expect_continue_with_a_body_over_the_limit_gets_413_at_once(run: Runner) -> None:
    async def scenario() -> None:
        async with serving(echo, max_body_bytes=10) as server:
            reader, writer = await connect(server)
            writer.write(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 11\r\n"
                         b"Expect: 100-continue\r\n\r\n")
            assert_json_error(await read_response(reader), 413, "--http-max-input-size")
            await assert_closed(reader)
            writer.close()

    run(scenario())


def assert_head_refused(run: Runner, sent: bytes, answered_before: int = 0) -> None:
    """``sent`` holds a head over a 1024-byte limit (after ``answered_before`` requests that
    are answered): it gets 431 and the connection closes."""
    async def scenario() -> None:
        async with serving(echo, max_header_bytes=1024) as server:
            reader, writer = await connect(server)
            writer.write(sent)
            for _ in range(answered_before):
                assert (await read_response(reader)).status == 200
            assert_json_error(await read_response(reader), 431, "1024")
            await assert_closed(reader)
            writer.close()

    run(scenario())


@pytest.mark.parametrize("complete", [True, False])
def test_head_over_the_limit_gets_431(run: Runner, complete: bool) -> None:
    head = b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 4000
    assert_head_refused(run, head + b"\r\n\r\n" if complete else head)


def test_unfinished_head_over_the_limit_after_a_pipelined_request_gets_431(run: Runner) -> None:
    # The second head begins within the read that ends the first request: its header lines,
    # not the bytes counted since it began, show it is over the limit.
    lines = "".join(f"X-{n}: {'a' * 90}\r\n" for n in range(20))
    assert_head_refused(run, request_bytes() + f"GET / HTTP/1.1\r\nHost: t\r\n{lines}".encode(),
                        answered_before=1)


@pytest.mark.parametrize("repeat", ["X-Big", "Host"])
def test_repeated_header_over_the_limit_gets_431(run: Runner, repeat: str) -> None:
    # Refused for its size even where the repeat itself is refused too (Host).
    host = "" if repeat == "Host" else "Host: t\r\n"
    lines = f"{host}{repeat}: t\r\n{repeat}: {'a' * 1100}\r\n"
    assert_head_refused(run, f"GET / HTTP/1.1\r\n{lines}\r\n".encode())


@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_body_over_the_limit_gets_413_naming_the_flag(run: Runner, framing: str) -> None:
    async def scenario() -> None:
        async with serving(echo, max_body_bytes=100) as server:
            reader, writer = await connect(server)
            if framing == "length":
                writer.write(request_bytes(body=b"b" * 101))
            else:
                writer.write(b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                             + b"32\r\n" + b"b" * 50 + b"\r\n" + b"33\r\n" + b"b" * 51 + b"\r\n")
            assert_json_error(await read_response(reader), 413, "--http-max-input-size")
            await assert_closed(reader)
            writer.close()

    run(scenario())


def test_too_many_chunks_gets_400(run: Runner) -> None:
    async def scenario() -> None:
        async with serving(echo, max_chunks=4) as server:
            reader, writer = await connect(server)
            writer.write(b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                         + b"1\r\nx\r\n" * 6 + b"0\r\n\r\n")
            assert_json_error(await read_response(reader), 400, "chunks")
            await assert_closed(reader)
            writer.close()

    run(scenario())


def test_stalled_request_head_gets_408_and_close(run: Runner) -> None:
    async def scenario() -> None:
        async with serving(echo, header_timeout_s=0.2) as server:
            reader, writer = await connect(server)
            writer.write(b"GET / HTTP/1.1\r\nHost: t\r\n")
            assert_json_error(await read_response(reader), 408, "timed out")
            writer.close()

    run(scenario())


def test_idle_keep_alive_connection_is_closed_silently(run: Runner) -> None:
    async def scenario() -> None:
        async with serving(echo, keepalive_timeout_s=0.2) as server:
            used_reader, used_writer = await connect(server)
            used_writer.write(request_bytes(body=b"x"))
            assert (await read_response(used_reader)).body == b"x"
            fresh_reader, fresh_writer = await connect(server)
            await assert_closed(used_reader)
            await assert_closed(fresh_reader)
            used_writer.close()
            fresh_writer.close()

    run(scenario())


MALFORMED = {
    "garbage": b"\x16\x03\x01 not http at all\r\n\r\n",
    "bad chunk size": (b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                       b"zz\r\nab\r\n"),
    "bad header char": b"GET / HTTP/1.1\r\nX-A: a\x01b\r\n\r\n",
    "space in header name": b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
}


@pytest.mark.parametrize("payload", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_request_gets_400_and_others_are_still_served(
    run: Runner, payload: bytes
) -> None:
    async def scenario() -> None:
        async with serving(echo) as server:
            good_reader, good_writer = await connect(server)
            bad_reader, bad_writer = await connect(server)
            bad_writer.write(payload)
            assert_json_error(await read_response(bad_reader), 400, "malformed")
            await assert_closed(bad_reader)
            good_writer.write(request_bytes(body=b"still here"))
            assert (await read_response(good_reader)).body == b"still here"
            good_writer.close()
            bad_writer.close()

    run(scenario())


def test_malformed_request_behind_a_pipelined_one_is_answered_after_it(run: Runner) -> None:
    async def scenario() -> None:
        async with serving(echo) as server:
            reader, writer = await connect(server)
            writer.write(request_bytes(body=b"first") + MALFORMED["garbage"])
            assert (await read_response(reader)).body == b"first"
            assert_json_error(await read_response(reader), 400, "malformed")
            await assert_closed(reader)
            writer.close()

    run(scenario())


async def wait_for_condition(condition: Callable[[], bool]) -> None:
    # The transport offers no event for "reading paused"; poll it, bounded.
    async with asyncio.timeout(BOUND_S):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.005)


def test_reading_pauses_while_too_many_requests_are_queued(run: Runner) -> None:
    gate = asyncio.Event()

    async def app(exchange: HttpExchange) -> None:
        await gate.wait()
        await echo(exchange)

    async def scenario() -> None:
        async with serving(app, max_pipeline=2) as server:
            reader, writer = await connect(server)
            writer.write(b"".join(request_bytes(body=f"{i}".encode()) for i in range(8)))
            (conn,) = server._connections.members
            await wait_for_condition(lambda: conn.reading_paused)
            gate.set()
            bodies = [(await read_response(reader)).body for _ in range(8)]
            assert bodies == [f"{i}".encode() for i in range(8)]
            assert not conn.reading_paused
            writer.write(request_bytes(body=b"after"))
            assert (await read_response(reader)).body == b"after"
            writer.close()

    run(scenario())


def test_streaming_waits_while_the_client_does_not_read(run: Runner) -> None:
    chunk = bytes(range(256)) * 128  # 32 KiB: big enough for the no-copy path
    count = 64
    blocked = asyncio.Event()
    written_when_blocked: list[int] = []

    async def app(exchange: HttpExchange) -> None:
        # A small fixed send buffer stops the kernel from absorbing megabytes first.
        server_socket = exchange._conn.transport.get_extra_info("socket")
        server_socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
        exchange.start_stream(200, [("Content-Type", "application/octet-stream")])
        for i in range(count):
            exchange.write_chunk(chunk)
            waiter = asyncio.ensure_future(exchange.wait_writable())
            await asyncio.sleep(0)  # an unpaused wait finishes within this turn
            if not waiter.done() and not blocked.is_set():
                written_when_blocked.append(i + 1)
                blocked.set()
            await waiter
        exchange.end_stream()

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        async with serving(app) as server:
            with socket.socket() as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.setblocking(False)
                await loop.sock_connect(sock, ("127.0.0.1", server.port))
                await loop.sock_sendall(sock, request_bytes())
                await bounded(blocked.wait())
                received = bytearray()
                while not received.endswith(b"\r\n0\r\n\r\n"):
                    data = await bounded(loop.sock_recv(sock, 1 << 20))
                    assert data, "server closed mid-stream"
                    received += data
        head, _, body = bytes(received).partition(b"\r\n\r\n")
        assert b"Transfer-Encoding: chunked" in head
        reader = asyncio.StreamReader()
        reader.feed_data(body)
        assert await read_chunked(reader) == chunk * count

    run(scenario())
    assert written_when_blocked and written_when_blocked[0] < count


@pytest.mark.parametrize("version", ["1.1", "1.0"])
def test_streamed_chunks_are_sent_at_once(run: Runner, version: str) -> None:
    first_chunk_read = asyncio.Event()

    async def app(exchange: HttpExchange) -> None:
        exchange.start_stream(200, [("Content-Type", "text/event-stream")])
        exchange.write_chunk(b"data: 1\n\n")
        exchange.write_chunk(b"")  # must not end the stream
        await first_chunk_read.wait()
        exchange.write_chunk(b"data: 2\n\n")
        exchange.end_stream()

    async def scenario() -> None:
        async with serving(app) as server:
            reader, writer = await connect(server)
            writer.write(request_bytes(version=version))
            head = await bounded(reader.readuntil(b"\r\n\r\n"))
            if version == "1.1":
                assert b"Transfer-Encoding: chunked" in head
                assert await bounded(reader.readuntil(b"\n\n\r\n")) == b"9\r\ndata: 1\n\n\r\n"
                first_chunk_read.set()
                assert await read_chunked(reader) == b"data: 2\n\n"
                writer.write(request_bytes(version=version))  # still usable
                assert b"Transfer-Encoding" in await bounded(reader.readuntil(b"\r\n\r\n"))
            else:
                assert b"Transfer-Encoding" not in head and b"Connection: close" in head
                assert await bounded(reader.readuntil(b"\n\n")) == b"data: 1\n\n"
                first_chunk_read.set()
                assert await bounded(reader.read()) == b"data: 2\n\n"
            writer.close()

    run(scenario())


class DisconnectProbe:
    """An app that waits, as a real handler would, only for its exchange's cancellation."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.left = asyncio.Event()
        self.calls = 0
        self.seen_disconnected: list[bool] = []

    async def __call__(self, exchange: HttpExchange) -> None:
        self.calls += 1
        exchange.cancellation.add_callback(lambda _: self.left.set())
        self.started.set()
        await self.left.wait()
        self.seen_disconnected.append(exchange.disconnected)


def leave(writer: asyncio.StreamWriter, how: str) -> None:
    if how == "reset":
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()
    elif how == "half-close":
        writer.write_eof()
    else:
        writer.close()


@pytest.mark.parametrize("how", ["close", "reset", "half-close"])
def test_client_leaving_mid_request_fires_the_disconnect_callback(run: Runner, how: str) -> None:
    probe = DisconnectProbe()

    async def scenario() -> None:
        async with serving(probe) as server:
            _, writer = await connect(server)
            # A second, pipelined request must be dropped, never handed to the app.
            writer.write(request_bytes(body=b"1") + request_bytes(body=b"2"))
            await bounded(probe.started.wait())
            leave(writer, how)
            await bounded(probe.left.wait())
            await bounded(server.wait_closed())
            writer.close()

    run(scenario())
    assert probe.seen_disconnected == [True]
    assert probe.calls == 1


def test_client_leaving_after_its_response_fires_nothing(run: Runner) -> None:
    fired: list[str] = []
    exchanges: list[HttpExchange] = []
    may_return = asyncio.Event()

    async def app(exchange: HttpExchange) -> None:
        exchanges.append(exchange)
        exchange.cancellation.add_callback(lambda _: fired.append("callback"))
        await echo(exchange)
        exchange.cancellation.add_callback(lambda _: fired.append("late callback"))
        await may_return.wait()  # still in the app when the client leaves

    async def scenario() -> None:
        async with serving(app) as server:
            reader, writer = await connect(server)
            writer.write(request_bytes(body=b"done"))
            assert (await read_response(reader)).body == b"done"
            writer.close()
            await wait_for_condition(lambda: exchanges[0].disconnected)
            may_return.set()
            await bounded(server.wait_closed())
            assert server.active_connections() == 0

    run(scenario())
    assert fired == []


def test_callbacks_can_be_removed_and_late_ones_run_at_once(run: Runner) -> None:
    fired: list[str] = []
    probe = DisconnectProbe()

    async def app(exchange: HttpExchange) -> None:
        removed = lambda _: fired.append("removed")  # noqa: E731
        exchange.cancellation.add_callback(removed)
        exchange.cancellation.remove_callback(removed)
        await probe(exchange)
        exchange.cancellation.add_callback(lambda _: fired.append("late"))
        fired.append("after add")
        exchange.respond(200, [])  # a no-op now

    async def scenario() -> None:
        async with serving(app) as server:
            _, writer = await connect(server)
            writer.write(request_bytes())
            await bounded(probe.started.wait())
            writer.close()
            await bounded(server.wait_closed())

    run(scenario())
    assert fired == ["late", "after add"]


@pytest.mark.parametrize("failure", ["raises", "returns without responding"])
def test_failing_app_gets_500_and_close(
    run: Runner, failure: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def app(exchange: HttpExchange) -> None:
        if failure == "raises":
            raise ValueError("boom")

    async def scenario() -> None:
        async with serving(app) as server:
            reader, writer = await connect(server)
            writer.write(request_bytes())
            response = await read_response(reader)
            assert response.status == 500
            assert response.headers["connection"] == "close"
            assert "error" in json.loads(response.body)
            await assert_closed(reader)
            writer.close()

    with caplog.at_level(logging.ERROR, logger="tritium.http"):
        run(scenario())
    assert any(r.name == "tritium.http" for r in caplog.records)
    if failure == "raises":
        assert "boom" in caplog.text


def test_close_idle_connections_spares_busy_ones(run: Runner) -> None:
    gate = asyncio.Event()
    started = asyncio.Event()

    async def app(exchange: HttpExchange) -> None:
        if exchange.request.path == "/slow":
            started.set()
            await gate.wait()
        await echo(exchange)

    async def scenario() -> None:
        async with serving(app) as server:
            idle_reader, idle_writer = await connect(server)
            idle_writer.write(request_bytes(body=b"idle"))
            assert (await read_response(idle_reader)).body == b"idle"
            busy_reader, busy_writer = await connect(server)
            busy_writer.write(request_bytes("/slow", b"busy"))
            await bounded(started.wait())
            server.close()
            server.close_idle_connections()
            await assert_closed(idle_reader)
            gate.set()
            assert (await read_response(busy_reader)).body == b"busy"
            busy_writer.write(request_bytes(body=b"still served"))
            assert (await read_response(busy_reader)).body == b"still served"
            assert server.active_connections() == 1
            idle_writer.close()
            busy_writer.close()

    run(scenario())


def test_list_and_memoryview_bodies_are_framed_by_byte_count(run: Runner) -> None:
    big = memoryview(bytearray(range(256)) * 256).cast("B").cast("H")  # 64 KiB of uint16

    async def app(exchange: HttpExchange) -> None:
        exchange.respond(200, [], [b"json", big, memoryview(b"tail")])

    async def scenario() -> None:
        async with serving(app) as server:
            reader, writer = await connect(server)
            writer.write(request_bytes())
            response = await read_response(reader)
            assert response.body == b"json" + big.tobytes() + b"tail"
            writer.close()

    run(scenario())


def test_head_response_has_length_but_no_body(run: Runner) -> None:
    async def scenario() -> None:
        async with serving(echo) as server:
            reader, writer = await connect(server)
            writer.write(b"HEAD /h HTTP/1.1\r\nHost: t\r\n\r\n" + request_bytes(body=b"next"))
            head = await bounded(reader.readuntil(b"\r\n\r\n"))
            assert b"Content-Length: 4\r\n" in head  # the length a GET would have had
            assert (await read_response(reader)).body == b"next"
            writer.close()

    run(scenario())


UPGRADES = {
    "h2c": b"GET /u HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n",
    "websocket with a body": (b"POST /u HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\n"
                              b"Upgrade: websocket\r\nContent-Length: 3\r\n\r\nabc"),
    "connect": b"CONNECT t:443 HTTP/1.1\r\nHost: t:443\r\n\r\n",
}


@pytest.mark.parametrize("upgrade", UPGRADES.values(), ids=UPGRADES.keys())
def test_upgrade_request_is_answered_as_plain_http_and_nothing_after_it(
    run: Runner, upgrade: bytes
) -> None:
    seen: list[str] = []

    async def app(exchange: HttpExchange) -> None:
        seen.append(exchange.request.path)
        await echo(exchange)

    async def scenario() -> None:
        async with serving(app) as server:
            reader, writer = await connect(server)
            # Whoever believes the protocol switched sends the other protocol's bytes next;
            # none of them may be read as a request.
            writer.write(upgrade + request_bytes("/smuggled", b"after upgrade"))
            response = await read_response(reader)
            assert response.status == 200
            assert response.headers["connection"] == "close"
            await assert_closed(reader)
            writer.close()

    run(scenario())
    assert len(seen) == 1 and "/smuggled" not in seen


# -- bounds: driven with bytes, no sockets ------------------------------------------------------


class FakeTransport(asyncio.Transport):
    """Records what the connection writes; its buffer fills until the test drains it."""

    def __init__(self, high_water: int = 1 << 30):
        super().__init__()
        self.protocol: HttpConnection | None = None
        self.written = bytearray()
        self.buffered = 0
        self.high_water = high_water
        self.reading = True
        self.closed = self.aborted = self.eof_written = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data
        self.buffered += len(data)
        if self.buffered > self.high_water and self.protocol is not None:
            self.protocol.pause_writing()

    def writelines(self, parts: Any) -> None:
        self.write(b"".join(parts))

    def drain(self) -> None:
        self.buffered = 0
        assert self.protocol is not None
        self.protocol.resume_writing()

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = self.aborted = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof_written = True

    def get_write_buffer_size(self) -> int:
        return self.buffered


def attach(app: App, transport: FakeTransport, **limits: Any) -> HttpConnection:
    conn = HttpConnection(app, HttpLimits(**limits), OpenConnections(cap=8))
    transport.protocol = conn
    conn.connection_made(transport)
    return conn


class Recorder:
    """An echo app that notes each path and lets the test await the n-th call."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.called = asyncio.Event()
        self.gate: asyncio.Event | None = None

    async def __call__(self, exchange: HttpExchange) -> None:
        self.paths.append(exchange.request.path)
        self.called.set()
        if self.gate is not None:
            await self.gate.wait()
        await echo(exchange)

    async def wait_calls(self, count: int) -> None:
        async with asyncio.timeout(BOUND_S):
            while len(self.paths) < count:
                self.called.clear()
                await self.called.wait()


async def turns(count: int = 10) -> None:
    """Let every ready task run a few times: for asserting that something did *not* happen."""
    for _ in range(count):
        await asyncio.sleep(0)


def test_closed_connection_and_its_partial_body_are_freed_without_a_collection() -> None:
    async def scenario() -> None:
        transport = FakeTransport()
        conn = attach(echo, transport)
        conn.data_received(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 4000000\r\n\r\n"
                           + b"x" * 1_000_000)
        alive = weakref.ref(conn)
        conn.connection_lost(None)
        transport.protocol = None
        del conn
        assert alive() is None

    gc.disable()  # only reference counting may free it
    try:
        asyncio.run(scenario())
    finally:
        gc.enable()


def test_connection_that_served_requests_is_freed_without_a_collection() -> None:
    async def scenario() -> None:
        app = Recorder()
        transport = FakeTransport()
        connections = OpenConnections(cap=8)
        conn = HttpConnection(app, HttpLimits(), connections)
        transport.protocol = conn
        conn.connection_made(transport)
        conn.data_received(request_bytes("/a", b"1") + request_bytes("/b", b"2"))
        await app.wait_calls(2)
        alive = weakref.ref(conn)
        conn.connection_lost(None)
        transport.protocol = None
        del conn
        await bounded(connections.wait_empty())
        assert alive() is None

    gc.disable()
    try:
        asyncio.run(scenario())
    finally:
        gc.enable()


@pytest.mark.parametrize(("head", "fragment"), [
    (b"GET / HTTP/1.1\r\n\r\n", "without a Host"),
    (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", "more than one Host"),
    (b"GET / HTTP/1.0\r\nHost: a\r\nhost: b\r\n\r\n", "more than one Host"),
])
def test_a_request_without_exactly_one_host_gets_400(head: bytes, fragment: str) -> None:
    async def scenario() -> None:
        app = Recorder()
        transport = FakeTransport()
        attach(app, transport).data_received(head + request_bytes("/next"))
        await turns()
        assert transport.written.startswith(b"HTTP/1.1 400 ")
        assert fragment.encode() in transport.written
        assert app.paths == []

    asyncio.run(scenario())


def test_http10_needs_no_host() -> None:
    async def scenario() -> None:
        app = Recorder()
        transport = FakeTransport()
        attach(app, transport).data_received(b"GET /old HTTP/1.0\r\n\r\n")
        await app.wait_calls(1)
        assert transport.written.startswith(b"HTTP/1.1 200 ")

    asyncio.run(scenario())


def test_a_peer_that_does_not_read_stops_both_reading_and_serving() -> None:
    async def scenario() -> None:
        app = Recorder()
        transport = FakeTransport(high_water=16)
        conn = attach(app, transport)
        conn.data_received(b"".join(request_bytes(f"/{i}", b"x" * 32) for i in range(3)))
        await app.wait_calls(1)
        await turns()
        # The first answer filled the buffer: nothing more is read or answered.
        assert (app.paths, transport.reading, conn.reading_paused) == (["/0"], False, True)
        transport.high_water = 1 << 30
        transport.drain()
        await app.wait_calls(3)
        assert app.paths == ["/0", "/1", "/2"]
        assert transport.reading

    asyncio.run(scenario())


def test_bodies_queued_behind_a_busy_request_are_bounded_in_bytes() -> None:
    async def scenario() -> None:
        app = Recorder()
        app.gate = asyncio.Event()
        transport = FakeTransport()
        conn = attach(app, transport, max_pipeline_bytes=1000)
        conn.data_received(request_bytes("/slow", b"a"))
        await app.wait_calls(1)
        conn.data_received(request_bytes("/1", b"b" * 600))
        assert transport.reading  # one body waiting is within the bound
        conn.data_received(request_bytes("/2", b"c" * 600))
        assert not transport.reading
        app.gate.set()
        await app.wait_calls(3)
        assert transport.reading

    asyncio.run(scenario())


def test_a_body_that_stops_gets_408_then_a_half_close_then_an_abort() -> None:
    async def scenario() -> None:
        transport = FakeTransport()
        conn = attach(echo, transport, body_timeout_s=10.0, min_body_rate=1.0)
        start = conn._connections.now
        conn.data_received(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
        conn.check_timeouts(start + 1.0)  # the sweep that sees the bytes marks progress
        conn.check_timeouts(start + 10.0)
        assert transport.written == b""
        conn.check_timeouts(start + 11.0)
        assert transport.written.startswith(b"HTTP/1.1 408 ")
        assert b"no data for 10 s" in transport.written
        assert transport.eof_written and not transport.closed  # draining what is in flight
        conn.check_timeouts(start + 11.0 + LINGER_S)
        assert transport.aborted

    asyncio.run(scenario())


def test_a_body_that_trickles_gets_408_after_its_grace() -> None:
    async def scenario() -> None:
        transport = FakeTransport()
        conn = attach(echo, transport, min_body_rate=100.0, body_rate_grace_s=5.0)
        start = conn._connections.now
        conn.data_received(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n")
        for second in range(1, 7):  # a byte a second, never a long pause
            conn.data_received(b"x")
            conn.check_timeouts(start + second)
        assert transport.written.startswith(b"HTTP/1.1 408 ")
        assert b"slower than 100 bytes/s" in transport.written

    asyncio.run(scenario())


def test_a_reader_that_stalls_is_aborted_after_the_send_timeout() -> None:
    async def scenario() -> None:
        transport = FakeTransport()
        conn = attach(echo, transport, send_timeout_s=10.0)
        start = conn._connections.now
        transport.buffered = 1000
        conn.pause_writing()
        transport.buffered = 900  # it reads a little: the clock starts again
        conn.check_timeouts(start + 9.0)
        conn.check_timeouts(start + 18.0)
        assert not transport.aborted
        conn.check_timeouts(start + 19.0)
        assert transport.aborted

    asyncio.run(scenario())


def test_pacing_judges_only_the_peers_time() -> None:
    limits = HttpLimits(header_timeout_s=10.0, keepalive_timeout_s=20.0, body_timeout_s=10.0,
                        min_body_rate=10.0, body_rate_grace_s=5.0)
    pacing = Pacing(limits, now=0.0)
    assert not pacing.idle_too_long(19.9) and pacing.idle_too_long(20.0)
    pacing.waiting_since = 100.0  # the server answered at 100: the head clock starts there
    assert not pacing.head_too_slow(109.0, head_started=50.0)
    assert pacing.head_too_slow(110.0, head_started=50.0)
    assert pacing.body_too_slow(205.0, 200.0, received=0) is None  # within the grace
    assert pacing.body_too_slow(206.0, 200.0, received=10) is None  # 10 bytes/s past it
    assert pacing.body_too_slow(207.0, 200.0, received=11) is not None
    assert pacing.body_too_slow(207.0, 206.5, received=0) is None  # the next body: afresh
    pacing.write_paused(300.0, buffered=500)
    assert not pacing.send_stalled(359.0, buffered=500)
    assert pacing.send_stalled(360.0, buffered=500)


# -- bounds over sockets ----------------------------------------------------------------------


def test_connections_over_the_cap_get_503_and_close_while_the_others_are_served(
    run: Runner
) -> None:
    async def scenario() -> None:
        async with serving(echo, max_connections=2) as server:
            kept = [await connect(server) for _ in range(2)]
            for reader, writer in kept:  # both are in: each has been answered
                writer.write(request_bytes(body=b"in"))
                assert (await read_response(reader)).body == b"in"
            reader, writer = await connect(server)
            refused = await read_response(reader)
            assert refused.status == 503 and refused.headers["connection"] == "close"
            await assert_closed(reader)
            writer.close()
            kept_reader, kept_writer = kept[0]
            kept_writer.write(request_bytes(body=b"still"))
            assert (await read_response(kept_reader)).body == b"still"
            kept[1][1].close()
            await wait_for_condition(lambda: server.active_connections() == 1)
            reader, writer = await connect(server)
            writer.write(request_bytes(body=b"room again"))
            assert (await read_response(reader)).body == b"room again"
            writer.close()
            kept_writer.close()

    run(scenario())


def test_a_pipelining_client_that_never_reads_holds_a_bounded_write_buffer(
    run: Runner
) -> None:
    answer = b"r" * 65536
    served = 0

    async def app(exchange: HttpExchange) -> None:
        nonlocal served
        served += 1
        exchange.respond(200, [], answer)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        async with serving(app) as server:
            with socket.socket() as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.setblocking(False)
                await loop.sock_connect(sock, ("127.0.0.1", server.port))
                await wait_for_condition(
                    lambda: any(c.connected for c in server._connections.members))
                (conn,) = server._connections.members
                conn.transport.get_extra_info("socket").setsockopt(
                    socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
                # 20,000 requests: 1.3 GiB of answers if the server kept producing them.
                await send_what_is_taken(sock, request_bytes() * 20000, seconds=1.0)
                await wait_for_condition(lambda: conn.reading_paused)
                assert conn.transport.get_write_buffer_size() <= 3 * len(answer)
                assert conn.pipelined <= 32 + 4096 // len(request_bytes()) + 1
                other_reader, other_writer = await connect(server)
                other_writer.write(request_bytes(body=b"x"))
                assert (await read_response(other_reader)).status == 200
                other_writer.close()
        assert served < 16

    run(scenario())


async def send_what_is_taken(sock: socket.socket, data: bytes, seconds: float) -> int:
    """Write ``data`` for up to ``seconds``, as far as the peer keeps reading; bytes taken."""
    loop = asyncio.get_running_loop()
    sent = 0
    deadline = loop.time() + seconds
    while sent < len(data) and loop.time() < deadline:
        try:
            sent += sock.send(data[sent:sent + 65536])
        except BlockingIOError:
            await asyncio.sleep(0.01)  # the peer stopped reading: look again shortly
    return sent


def test_a_body_sent_a_byte_at_a_time_gets_408_within_its_bounds(run: Runner) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        async with serving(echo, min_body_rate=200.0, body_rate_grace_s=0.3) as server:
            reader, writer = await connect(server)
            writer.write(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n")
            started = loop.time()
            answer = asyncio.ensure_future(read_response(reader))
            while not answer.done() and loop.time() - started < BOUND_S:
                writer.write(b"x")
                await asyncio.wait([answer], timeout=0.05)
            assert_json_error(await answer, 408, "slower than 200 bytes/s")
            assert loop.time() - started < 3.0
            await assert_closed(reader)
            writer.close()

    run(scenario())


def test_close_when_idle_closes_each_connection_once_its_work_is_done(run: Runner) -> None:
    gate = asyncio.Event()
    started = asyncio.Event()

    async def app(exchange: HttpExchange) -> None:
        if exchange.request.path == "/slow":
            started.set()
            await gate.wait()
        await echo(exchange)

    async def scenario() -> None:
        async with serving(app) as server:
            idle_reader, idle_writer = await connect(server)
            idle_writer.write(request_bytes(body=b"idle"))
            assert (await read_response(idle_reader)).body == b"idle"
            busy_reader, busy_writer = await connect(server)
            busy_writer.write(request_bytes("/slow", b"busy") + request_bytes(body=b"queued"))
            await bounded(started.wait())
            server.close()
            server.close_when_idle()
            await assert_closed(idle_reader)
            gate.set()
            assert (await read_response(busy_reader)).body == b"busy"
            assert (await read_response(busy_reader)).body == b"queued"  # it had it already
            await assert_closed(busy_reader)
            await bounded(server.wait_closed())
            idle_writer.close()
            busy_writer.close()

    run(scenario())


def test_a_burst_of_connections_does_not_pass_the_cap_together(run: Runner) -> None:
    async def scenario() -> None:
        async with serving(echo, max_connections=4) as server:
            # All ten handshakes complete before the server accepts any of them.
            burst = await asyncio.gather(*(connect(server) for _ in range(10)))
            statuses = []
            for reader, writer in burst:
                writer.write(request_bytes(body=b"x"))
                statuses.append((await read_response(reader)).status)
                writer.close()
            assert sorted(statuses) == [200] * 4 + [503] * 6

    run(scenario())


def test_a_connection_that_never_connects_stops_counting() -> None:
    async def scenario() -> None:
        connections = OpenConnections(cap=8)
        conn = HttpConnection(echo, HttpLimits(header_timeout_s=10.0), connections)
        assert len(connections) == 1  # counted as soon as the listener made it
        conn.check_timeouts(connections.now + 10.0)
        assert len(connections) == 1
        conn.check_timeouts(connections.now + 11.0)
        assert len(connections) == 0
        transport = FakeTransport()
        conn.connection_made(transport)  # too late: refused
        assert transport.aborted

    asyncio.run(scenario())


FAULTY_FRAMING = {
    "chunked not alone": (b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: identity, chunked"
                          b"\r\n\r\n2\r\nab\r\n0\r\n\r\n", 501, "only chunked"),
    "gzip coding": (b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\n",
                    501, "only chunked"),
    "HTTP/1.0 with a coding": (b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"
                               b"2\r\nab\r\n0\r\n\r\n", 400, "HTTP/1.0"),
}


@pytest.mark.parametrize(("payload", "status", "words"), FAULTY_FRAMING.values(),
                         ids=FAULTY_FRAMING.keys())
def test_transfer_codings_other_than_chunked_alone_are_refused(
        run: Runner, payload: bytes, status: int, words: str) -> None:
    """RFC 9112 6.1: chunked must be the only (final) coding, and an HTTP/1.0 message with
    Transfer-Encoding has faulty framing: refused, and the connection closed, so no body
    bytes are read as another request."""
    async def scenario() -> None:
        async with serving(echo) as server:
            reader, writer = await connect(server)
            writer.write(payload)
            assert_json_error(await read_response(reader), status, words)
            await assert_closed(reader)
            writer.close()

    run(scenario())


@pytest.mark.parametrize("size", [3 * 65536, 3 << 20])
def test_a_body_of_several_reads_is_held_once(size: int) -> None:
    """A body that arrives in many reads grows in one buffer: a small one is handed over as
    bytes, a large one as a read-only view of that buffer (no joined copy beside it)."""
    received: list[HttpRequest] = []

    async def keep(exchange: HttpExchange) -> None:
        received.append(exchange.request)
        exchange.respond(200, [], b"")

    async def scenario() -> None:
        transport = FakeTransport()
        conn = attach(keep, transport, max_body_bytes=8 << 20)
        body = bytes(range(256)) * (size // 256)
        conn.data_received(request_bytes("/", body)[:-size])
        for start in range(0, size, 65536):
            conn.data_received(body[start:start + 65536])
        await turns()
        assert len(received) == 1
        held = received[0].body
        assert held == body
        if size <= 1 << 20:
            assert type(held) is bytes
        else:
            assert isinstance(held, memoryview) and held.readonly
            assert isinstance(held.obj, bytearray)
        conn.connection_lost(None)

    asyncio.run(scenario())
