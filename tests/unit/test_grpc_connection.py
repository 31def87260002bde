"""The gRPC connection driven with bytes and no socket, python-hyper's h2 as its client."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
import hpack
import pytest
from tritonclient.grpc import service_pb2

from tritium.core.cancellation import CancelReason
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.inflight import InFlight
from tritium.frontends.grpc.call import Call, GrpcLimits, Rpc
from tritium.frontends.grpc.connection import GrpcConnection
from tritium.frontends.grpc.frames import FrameCollector
from tritium.frontends.grpc.http2 import (
    END_HEADERS,
    END_STREAM,
    PREFACE,
    Chunk,
    FrameType,
    H2Error,
    frame,
)
from tritium.frontends.grpc.inbound import Inbound
from tritium.frontends.grpc.sending import Outbox
from tritium.frontends.grpc.status import GrpcStatus
from tritium.frontends.grpc.windows import ByteBudget
from tritium.frontends.grpc.wire import length_prefixed

BOUND_S = 5.0  # generous: a wait that hits it means the behaviour is missing
Request = service_pb2.ModelInferRequest


class FakeOutput:
    """Records what the connection writes, one entry per ``write``."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False
        self.reading = True

    def write(self, chunks: list[Chunk]) -> None:
        assert not self.closed, "write after close"
        self.writes.append(b"".join(chunks))

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


@dataclass
class Reply:
    """What the client saw of one stream."""

    headers: dict[str, str] = field(default_factory=dict)
    data: bytearray = field(default_factory=bytearray)
    trailers: dict[str, str] = field(default_factory=dict)
    ended: bool = False
    reset: int | None = None
    credit: int = 0  # WINDOW_UPDATE increments the server granted

    @property
    def status(self) -> int:
        return int((self.trailers or self.headers)["grpc-status"])

    @property
    def message(self) -> str:
        return (self.trailers or self.headers).get("grpc-message", "")

    def messages(self) -> list[bytes]:
        found, data = [], bytes(self.data)
        while data:
            size = int.from_bytes(data[1:5], "big")
            found.append(data[5:5 + size])
            data = data[5 + size:]
        return found


class Service:
    """A tiny router whose handlers hand the test each call they serve."""

    def __init__(self) -> None:
        self.started: asyncio.Queue[Call] = asyncio.Queue()
        self.router = {
            "/t.S/Echo": Rpc(Request, unary=self.echo),
            "/t.S/Fail": Rpc(Request, unary=self.fail),
            "/t.S/Wait": Rpc(Request, unary=self.wait),
            "/t.S/Stream": Rpc(Request, stream=self.stream),
        }

    async def echo(self, request: Any, call: Call) -> Any:
        self.started.put_nowait(call)
        return request

    async def fail(self, request: Any, call: Call) -> Any:
        self.started.put_nowait(call)
        raise TritiumError(ErrorCode.NOT_FOUND, f"no model '{request.model_name}'")

    async def wait(self, request: Any, call: Call) -> Any:
        """Answers only once the call is cancelled (the answer then goes nowhere)."""
        cancelled: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake(_: object) -> None:
            if not cancelled.done():
                cancelled.set_result(None)
        call.cancellation.add_callback(wake)
        self.started.put_nowait(call)
        await cancelled
        return request

    async def stream(self, call: Call) -> None:
        self.started.put_nowait(call)
        async for request in call.requests():
            call.write(request)

    async def next_call(self) -> Call:
        return await asyncio.wait_for(self.started.get(), BOUND_S)


class Peer:
    """A GrpcConnection under test and an h2 client talking to it through memory."""

    def __init__(self, service: Service, limits: GrpcLimits | None = None) -> None:
        self.output = FakeOutput()
        self.limits = limits or GrpcLimits()
        self.all_calls: InFlight[Call] = InFlight()
        self.conn = GrpcConnection(service.router, self.limits, self.output,
                                   budget=ByteBudget(self.limits.max_buffered_bytes),
                                   calls=self.all_calls)
        config = h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        self.h2 = h2.connection.H2Connection(config=config)
        self.h2.initiate_connection()
        self.replies: dict[int, Reply] = {}
        self.terminated: h2.events.ConnectionTerminated | None = None
        self.after_goaway: list[bytes] = []  # frames h2 no longer reads, raw
        self._seen = 0  # writes already given to the client

    def pump(self) -> None:
        """Hand the server what the client queued, and the client what the server wrote."""
        data = self.h2.data_to_send()
        if data:
            self.conn.receive(data)
        self.collect()

    def raw(self, data: bytes) -> None:
        """Bytes the h2 client would never send."""
        self.conn.receive(data)
        self.collect()

    def collect(self) -> None:
        """The server's frames to the h2 client, one at a time: h2 reads nothing after a
        GOAWAY (the PING that follows the first one would be a protocol error to it), so
        from there they are kept raw in ``after_goaway``."""
        for data in self.output.writes[self._seen:]:
            at = 0
            while at < len(data):
                end = at + 9 + int.from_bytes(data[at:at + 3], "big")
                if self.terminated is not None:
                    self.after_goaway.append(data[at:end])
                else:
                    for event in self.h2.receive_data(data[at:end]):
                        self._note(event)
                at = end
        self._seen = len(self.output.writes)

    async def flushed(self) -> None:
        """What the connection flushes soon (a GOAWAY and its PING), read by the client."""
        await asyncio.sleep(0)
        self.collect()

    async def let_go(self) -> None:
        """Answer the PING after the first GOAWAY, as a client that read both does: the
        final GOAWAY is then in ``goaways()``."""
        await self.flushed()
        self.answer_ping()
        await self.flushed()

    def answer_ping(self) -> None:
        """Acknowledge the PING that followed the server's first GOAWAY, as a client that
        read both does."""
        pings = [f for f in self.after_goaway if f[3] == FrameType.PING and not f[4] & 0x1]
        assert pings, "no PING after the GOAWAY"
        self.raw(frame(FrameType.PING, 0x1, 0, pings[-1][9:17]))

    def goaways(self) -> list[tuple[int, int]]:
        """(last stream id, error code) of each GOAWAY the server sent after the first."""
        return [(int.from_bytes(f[9:13], "big"), int.from_bytes(f[13:17], "big"))
                for f in self.after_goaway if f[3] == FrameType.GOAWAY]

    def _note(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.ConnectionTerminated):
            self.terminated = event
            return
        stream_id = getattr(event, "stream_id", None)
        if not stream_id:
            return
        reply = self.replies.setdefault(stream_id, Reply())
        if isinstance(event, h2.events.ResponseReceived):
            reply.headers = dict(event.headers)  # type: ignore[arg-type]
        elif isinstance(event, h2.events.DataReceived):
            reply.data += event.data or b""
        elif isinstance(event, h2.events.TrailersReceived):
            reply.trailers = dict(event.headers)  # type: ignore[arg-type]
        elif isinstance(event, h2.events.StreamEnded):
            reply.ended = True
        elif isinstance(event, h2.events.StreamReset):
            reply.reset = event.error_code
        elif isinstance(event, h2.events.WindowUpdated):
            reply.credit += event.delta or 0

    def start(self, path: str, *requests: Any, end: bool = True,
              headers: tuple[tuple[str, str], ...] = (), end_with_data: bool = False) -> int:
        """Open a stream and send ``requests``; ``end``: then END_STREAM, in an empty DATA
        frame of its own, or (``end_with_data``) on the last request's frame."""
        stream_id = self.h2.get_next_available_stream_id()
        self.h2.send_headers(stream_id, [
            (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "t"),
            ("content-type", "application/grpc"), ("te", "trailers"), *headers])
        for i, request in enumerate(requests, 1):
            self.h2.send_data(stream_id, length_prefixed(request.SerializeToString()),
                              end_stream=end and end_with_data and i == len(requests))
        if end and not (end_with_data and requests):
            self.h2.end_stream(stream_id)
        self.pump()
        return stream_id

    def ended(self, stream_id: int) -> Reply:
        reply = self.replies[stream_id]
        assert reply.ended, reply
        return reply


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(coro, BOUND_S * 2))


async def finished(call: Call) -> None:
    assert call.task is not None
    await asyncio.wait_for(asyncio.shield(call.task), BOUND_S)


def forgotten(peer: Peer) -> bool:
    return not peer.conn.calls and not peer.all_calls


# -- calls answered ---------------------------------------------------------------------
def test_unary_call_answered_with_the_reply_and_status_ok() -> None:
    async def body() -> None:
        service = Service()
        peer = Peer(service)
        stream_id = peer.start("/t.S/Echo", Request(model_name="m", id="42"))
        call = await service.next_call()
        await finished(call)
        peer.collect()
        reply = peer.ended(stream_id)
        assert reply.headers[":status"] == "200"
        assert reply.headers["content-type"] == "application/grpc"
        assert reply.status == GrpcStatus.OK
        assert [Request.FromString(m) for m in reply.messages()] == \
            [Request(model_name="m", id="42")]
        assert reply.reset is None
        assert call.cancellation.reason is None
        assert forgotten(peer)
    run(body())


def test_streaming_call_echoes_each_request_in_order() -> None:
    async def body() -> None:
        service = Service()
        peer = Peer(service)
        sent = [Request(id=str(i)) for i in range(3)]
        stream_id = peer.start("/t.S/Stream", *sent)
        call = await service.next_call()
        await finished(call)
        peer.collect()
        reply = peer.ended(stream_id)
        assert [Request.FromString(m) for m in reply.messages()] == sent
        assert reply.status == GrpcStatus.OK
        assert call.cancellation.reason is None
        assert forgotten(peer)
    run(body())


def test_unknown_method_is_unimplemented_trailers_only() -> None:
    async def body() -> None:
        peer = Peer(Service())
        stream_id = peer.start("/t.S/Nope", Request())
        reply = peer.ended(stream_id)
        assert reply.headers[":status"] == "200"
        assert reply.status == GrpcStatus.UNIMPLEMENTED
        assert "/t.S/Nope" in reply.message
        assert not reply.data and not reply.trailers
        assert reply.reset is None
        assert forgotten(peer)
    run(body())


def test_unknown_method_on_an_open_stream_is_answered_and_reset() -> None:
    async def body() -> None:
        peer = Peer(Service())
        stream_id = peer.start("/t.S/Nope", end=False)
        reply = peer.ended(stream_id)
        assert reply.status == GrpcStatus.UNIMPLEMENTED
        assert reply.reset == H2Error.NO_ERROR
    run(body())


# -- every way a call ends ----------------------------------------------------------------
def test_handler_raising_tritium_error_ends_with_its_mapped_status() -> None:
    async def body() -> None:
        service = Service()
        peer = Peer(service)
        stream_id = peer.start("/t.S/Fail", Request(model_name="absent"))
        call = await service.next_call()
        await finished(call)
        peer.collect()
        reply = peer.ended(stream_id)
        assert reply.status == GrpcStatus.NOT_FOUND
        assert reply.message == "no model 'absent'"
        assert not reply.data
        assert call.cancellation.reason is None  # the handler itself decided
        assert forgotten(peer)
    run(body())


def test_unreadable_request_is_invalid_argument_and_cancels_the_call() -> None:
    async def body() -> None:
        peer = Peer(Service())
        stream_id = peer.h2.get_next_available_stream_id()
        peer.start("/t.S/Echo", end=False)
        call = peer.conn.calls[stream_id]
        peer.h2.send_data(stream_id, length_prefixed(b"\x0a\xff"), end_stream=True)
        peer.pump()
        await finished(call)
        peer.collect()
        assert peer.ended(stream_id).status == GrpcStatus.INVALID_ARGUMENT
        assert call.cancellation.reason is CancelReason.CLIENT_CANCELLED
        assert forgotten(peer)
    run(body())


def test_client_reset_cancels_the_call_as_client_cancelled() -> None:
    async def body() -> None:
        service = Service()
        peer = Peer(service)
        stream_id = peer.start("/t.S/Wait", Request())
        call = await service.next_call()
        peer.h2.reset_stream(stream_id, H2Error.CANCEL)
        peer.pump()
        assert call.cancellation.reason is CancelReason.CLIENT_CANCELLED
        assert forgotten(peer)
        writes = len(peer.output.writes)
        await finished(call)
        assert len(peer.output.writes) == writes  # the late answer goes nowhere
        assert not peer.replies.get(stream_id, Reply()).ended
    run(body())


def test_client_reset_of_a_streaming_call_ends_its_requests() -> None:
    async def body() -> None:
        service = Service()
        peer = Peer(service)
        stream_id = peer.start("/t.S/Stream", Request(id="1"), end=False)
        call = await service.next_call()
        peer.h2.reset_stream(stream_id, H2Error.CANCEL)
        peer.pump()
        await finished(call)  # ``requests()`` stops once the stream is reset
        assert call.cancellation.reason is CancelReason.CLIENT_CANCELLED
        assert forgotten(peer)
    run(body())


def test_lost_connection_cancels_every_call_as_client_disconnected() -> None:
    async def body() -> None:
        service = Service()
        peer = Peer(service)
        peer.start("/t.S/Wait", Request())
        peer.start("/t.S/Stream", end=False)
        calls = [await service.next_call(), await service.next_call()]
        writes = len(peer.output.writes)
        peer.conn.lost()
        for call in calls:
            assert call.cancellation.reason is CancelReason.CLIENT_DISCONNECTED
            await finished(call)
        assert forgotten(peer)
        assert len(peer.output.writes) == writes
    run(body())


def test_lost_connection_lets_go_of_every_byte_it_held() -> None:
    async def body() -> None:
        service = Service()
        peer = Peer(service)
        budget = peer.conn.inbound._budget
        stream_id = peer.start("/t.S/Stream", end=False)
        call = await service.next_call()
        announced = 4 * 2**20
        partial = b"\x00" + announced.to_bytes(4, "big") + bytes(2**19)  # an eighth of it
        peer.raw(_data(stream_id, len(partial)).replace(bytes(len(partial)), partial))
        peer.raw(frame(FrameType.DATA, 0, 1, b"\x00" * 5000)[:2000])  # an incomplete frame
        assert call.reader.partial == len(partial)
        assert budget.held >= len(partial)
        peer.conn.lost()
        await finished(call)
        # The call's task may outlive the connection a little; the bytes it held do not.
        assert call.reader.partial == 0 and not call.messages
        assert budget.held == 0
        assert peer.conn._reader._held == 0
    run(body())


def test_deadline_ends_the_call_with_deadline_exceeded() -> None:
    async def body() -> None:
        service = Service()
        peer = Peer(service)
        stream_id = peer.start("/t.S/Wait", Request(), headers=(("grpc-timeout", "20m"),))
        call = await service.next_call()
        await finished(call)  # the handler returns once the deadline cancelled it
        assert call.cancellation.reason is CancelReason.DEADLINE
        peer.collect()
        reply = peer.ended(stream_id)
        assert reply.status == GrpcStatus.DEADLINE_EXCEEDED
        assert reply.message == "Deadline Exceeded"
        assert call.timer is None
        assert forgotten(peer)
    run(body())


def test_deadline_of_an_open_stream_ends_it_and_resets_it() -> None:
    async def body() -> None:
        service = Service()
        peer = Peer(service)
        stream_id = peer.start("/t.S/Stream", end=False, headers=(("grpc-timeout", "20m"),))
        call = await service.next_call()
        await finished(call)
        peer.collect()
        reply = peer.ended(stream_id)
        assert reply.status == GrpcStatus.DEADLINE_EXCEEDED
        assert reply.reset == H2Error.NO_ERROR  # the client need not send the rest
        assert call.cancellation.reason is CancelReason.DEADLINE
        assert forgotten(peer)
    run(body())


def test_client_reset_at_its_deadline_is_deadline() -> None:
    async def body() -> None:
        service = Service()
        peer = Peer(service)
        stream_id = peer.start("/t.S/Wait", Request(), headers=(("grpc-timeout", "50m"),))
        call = await service.next_call()
        peer.h2.reset_stream(stream_id, H2Error.CANCEL)
        peer.pump()
        assert call.cancellation.reason is CancelReason.DEADLINE
        assert call.timer is None
        assert forgotten(peer)
        await finished(call)
    run(body())


def test_malformed_timeout_is_invalid_argument() -> None:
    async def body() -> None:
        peer = Peer(Service())
        stream_id = peer.start("/t.S/Echo", Request(), headers=(("grpc-timeout", "soon"),))
        reply = peer.ended(stream_id)
        assert reply.status == GrpcStatus.INVALID_ARGUMENT
        assert forgotten(peer)
    run(body())


def test_shut_down_ends_every_call_as_shutdown_and_closes() -> None:
    async def body() -> None:
        service = Service()
        peer = Peer(service)
        first = peer.start("/t.S/Wait", Request())
        second = peer.start("/t.S/Stream", end=False)
        calls = [await service.next_call(), await service.next_call()]
        peer.conn.shut_down(GrpcStatus.UNAVAILABLE, "server shutting down")
        assert peer.output.closed
        peer.collect()
        for stream_id in (first, second):
            reply = peer.ended(stream_id)
            assert reply.status == GrpcStatus.UNAVAILABLE
            assert reply.message == "server shutting down"
        for call in calls:
            assert call.cancellation.reason is CancelReason.SHUTDOWN
            await finished(call)
        assert forgotten(peer)
    run(body())


def test_go_away_with_no_calls_closes_once_the_ping_is_answered() -> None:
    async def body() -> None:
        peer = Peer(Service())
        peer.pump()
        peer.conn.go_away()
        await peer.flushed()
        # First every stream id there is, then a PING; the final GOAWAY when it comes back.
        assert peer.terminated is not None and peer.terminated.error_code == H2Error.NO_ERROR
        assert peer.terminated.last_stream_id == (1 << 31) - 1
        assert not peer.output.closed
        await peer.let_go()
        assert peer.goaways() == [(0, H2Error.NO_ERROR)]
        assert peer.output.closed
    run(body())


def test_a_stream_crossing_the_first_goaway_is_served() -> None:
    """A client that opened a stream before it read the first GOAWAY (a proxy's HEADERS
    crossing it on the wire) gets its answer; the final GOAWAY names that stream."""
    async def body() -> None:
        service = Service()
        peer = Peer(service)
        peer.pump()
        peer.conn.go_away()
        block = hpack.Encoder().encode([(":method", "POST"), (":path", "/t.S/Stream"),
                                        ("content-type", "application/grpc")])
        peer.conn.receive(frame(FrameType.HEADERS, END_HEADERS, 1, block))
        call = await service.next_call()
        assert call.stream_id == 1 and call.cancellation.reason is None
        await peer.let_go()
        assert peer.goaways() == [(1, H2Error.NO_ERROR)]
        assert not peer.output.closed  # its call is still running
        peer.conn.lost()
        await finished(call)
    run(body())


def test_a_peer_that_never_answers_the_ping_gets_the_final_goaway_in_time() -> None:
    async def body() -> None:
        peer = Peer(Service())
        peer.pump()
        peer.conn.go_away()
        peer.conn.check_timeouts(peer.conn.now() + 1.0)
        await peer.flushed()
        assert peer.goaways() == [] and not peer.output.closed
        peer.conn.check_timeouts(peer.conn.now() + 10.0)
        await peer.flushed()
        assert peer.goaways() == [(0, H2Error.NO_ERROR)]
        assert peer.output.closed
    run(body())


def test_go_away_refuses_new_streams_and_keeps_the_old() -> None:
    async def body() -> None:
        service = Service()
        peer = Peer(service)
        stream_id = peer.start("/t.S/Stream", end=False)
        call = await service.next_call()
        peer.conn.go_away()
        await peer.let_go()
        assert not peer.output.closed
        # h2 sends nothing after a GOAWAY: the late stream is raw bytes.
        block = hpack.Encoder().encode([(":method", "POST"), (":path", "/t.S/Echo"),
                                        ("content-type", "application/grpc")])
        before = len(peer.output.writes)
        peer.conn.receive(frame(FrameType.HEADERS, END_HEADERS | END_STREAM, 3, block))
        sent = FrameCollector(1 << 20, 1 << 16).frames(
            PREFACE + b"".join(peer.output.writes[before:]))
        assert [(f.kind, f.stream_id, bytes(f.payload)) for f in sent] == \
            [(FrameType.RST_STREAM, 3, int(H2Error.REFUSED_STREAM).to_bytes(4, "big"))]
        assert list(peer.conn.calls) == [stream_id]
        assert call.cancellation.reason is None
        peer.conn.lost()
        await finished(call)
    run(body())


# -- flow control and stream errors ------------------------------------------------------
def _data(stream_id: int, size: int, flags: int = 0) -> bytes:
    return frame(FrameType.DATA, flags, stream_id, bytes(size))


def test_stream_window_overrun_is_reset_with_flow_control_error() -> None:
    async def body() -> None:
        service = Service()
        peer = Peer(service, GrpcLimits(stream_window=1024))
        peer.pump()  # the client acknowledges the server's settings
        stream_id = peer.start("/t.S/Stream", end=False)
        call = await service.next_call()
        peer.raw(_data(stream_id, 1024))
        assert peer.replies.get(stream_id, Reply()) == Reply()  # no reset, no new credit
        peer.raw(_data(stream_id, 1))
        assert peer.replies[stream_id].reset == H2Error.FLOW_CONTROL_ERROR
        assert call.cancellation.reason is CancelReason.CLIENT_CANCELLED
        await finished(call)
        assert forgotten(peer)
        assert peer.terminated is None and not peer.output.closed
        await _still_serves(service, peer)
    run(body())


def test_connection_window_overrun_ends_the_connection() -> None:
    async def body() -> None:
        service = Service()
        limits = GrpcLimits(stream_window=1 << 20, connection_window=70000)
        peer = Peer(service, limits)
        peer.pump()
        stream_id = peer.start("/t.S/Stream", end=False)
        call = await service.next_call()
        peer.raw(_data(stream_id, 70001))  # one frame past all the credit ever granted
        assert peer.terminated is not None
        assert peer.terminated.error_code == H2Error.FLOW_CONTROL_ERROR
        assert peer.output.closed
        peer.conn.lost()
        assert call.cancellation.reason is CancelReason.CLIENT_DISCONNECTED
    run(body())


def test_data_after_end_stream_is_a_stream_error_only() -> None:
    async def body() -> None:
        service = Service()
        peer = Peer(service)
        stream_id = peer.start("/t.S/Wait", Request())
        call = await service.next_call()
        peer.raw(frame(FrameType.DATA, END_STREAM, stream_id, length_prefixed(b"")))
        assert peer.replies[stream_id].reset == H2Error.STREAM_CLOSED
        assert call.cancellation.reason is CancelReason.CLIENT_CANCELLED
        assert forgotten(peer)
        await finished(call)
        assert peer.terminated is None and not peer.output.closed
        await _still_serves(service, peer)
    run(body())


async def _still_serves(service: Service, peer: Peer) -> None:
    stream_id = peer.start("/t.S/Echo", Request(id="after"))
    await finished(await service.next_call())
    peer.collect()
    reply = peer.ended(stream_id)
    assert reply.status == GrpcStatus.OK
    assert [Request.FromString(m) for m in reply.messages()] == [Request(id="after")]


def test_reply_larger_than_the_client_window_waits_for_window_updates() -> None:
    async def body() -> None:
        service = Service()
        peer = Peer(service)
        peer.h2.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 100})
        peer.pump()
        peer.pump()  # the server's ACK applies the window to the client's new streams
        sent = Request(id="x" * 1000)
        expected = length_prefixed(sent.SerializeToString())
        stream_id = peer.start("/t.S/Echo", sent)
        call = await service.next_call()
        await finished(call)
        peer.collect()
        reply = peer.replies[stream_id]
        assert len(reply.data) == 100 and not reply.ended
        assert peer.conn.calls == {stream_id: call}  # the trailers wait behind the data
        peer.h2.increment_flow_control_window(300, stream_id=stream_id)
        peer.pump()
        assert len(reply.data) == 400 and not reply.ended
        peer.h2.increment_flow_control_window(len(expected), stream_id=stream_id)
        peer.pump()
        assert peer.ended(stream_id).status == GrpcStatus.OK
        assert bytes(reply.data) == expected
        assert call.cancellation.reason is None
        assert forgotten(peer)
    run(body())


def test_reply_waiting_for_window_is_dropped_when_the_client_resets() -> None:
    async def body() -> None:
        service = Service()
        peer = Peer(service)
        peer.h2.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 10})
        peer.pump()
        peer.pump()
        stream_id = peer.start("/t.S/Echo", Request(id="y" * 100))
        call = await service.next_call()
        await finished(call)
        peer.h2.reset_stream(stream_id, H2Error.CANCEL)
        peer.pump()
        assert forgotten(peer)
        assert not call.pending
        assert call.cancellation.reason is CancelReason.CLIENT_CANCELLED
    run(body())


# -- output ------------------------------------------------------------------------------
def test_one_write_per_receive() -> None:
    async def body() -> None:
        peer = Peer(Service())
        peer.pump()
        assert len(peer.output.writes) == 1  # SETTINGS and the connection's window
        peer.h2.ping(b"12345678")
        peer.h2.ping(b"abcdefgh")
        stream_ids = [peer.h2.get_next_available_stream_id()]
        peer.h2.send_headers(stream_ids[0], [
            (":method", "POST"), (":scheme", "http"), (":path", "/t.S/Nope"),
            (":authority", "t"), ("content-type", "application/grpc")], end_stream=True)
        stream_ids.append(peer.h2.get_next_available_stream_id())
        peer.h2.send_headers(stream_ids[1], [
            (":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "t")],
            end_stream=True)
        before = len(peer.output.writes)
        peer.pump()  # SETTINGS ACK, two PINGs and two streams in one read
        assert len(peer.output.writes) == before + 1
        assert peer.ended(stream_ids[0]).status == GrpcStatus.UNIMPLEMENTED
        assert peer.ended(stream_ids[1]).headers[":status"] == "415"
    run(body())


def test_reply_of_a_handler_is_one_write() -> None:
    async def body() -> None:
        service = Service()
        peer = Peer(service)
        stream_id = peer.start("/t.S/Echo", Request(id="1"))
        before = len(peer.output.writes)
        await finished(await service.next_call())
        assert len(peer.output.writes) == before + 1  # headers, message and trailers
        peer.collect()
        assert peer.ended(stream_id).status == GrpcStatus.OK
    run(body())


def test_read_that_needs_no_answer_writes_nothing() -> None:
    async def body() -> None:
        peer = Peer(Service())
        peer.pump()
        peer.pump()  # the client's SETTINGS ACK
        before = len(peer.output.writes)
        peer.raw(frame(FrameType.SETTINGS, 1, 0) + frame(FrameType.PRIORITY, 0, 9, bytes(5)))
        assert len(peer.output.writes) == before
    run(body())


def test_write_paused_pauses_reading() -> None:
    async def body() -> None:
        peer = Peer(Service())
        peer.conn.set_write_paused(True)
        assert not peer.output.reading and peer.conn.write_paused
        peer.conn.set_write_paused(False)
        assert peer.output.reading and not peer.conn.write_paused
    run(body())


def test_non_http2_client_gets_a_plain_400_and_is_closed() -> None:
    async def body() -> None:
        peer = Peer(Service())
        peer.conn.receive(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert peer.output.closed
        assert len(peer.output.writes) == 1
        assert peer.output.writes[0].startswith(b"HTTP/1.1 400 Bad Request\r\n")
    run(body())


def test_hpack_garbage_is_compression_error() -> None:
    async def body() -> None:
        peer = Peer(Service())
        peer.pump()
        block = hpack.Encoder().encode([(":method", "POST")]) + b"\xff\xff\xff\xff"
        peer.raw(frame(FrameType.HEADERS, 0x4, 1, block))
        assert peer.terminated is not None
        assert peer.terminated.error_code == H2Error.COMPRESSION_ERROR
        assert peer.output.closed
    run(body())


def test_go_away_lets_calls_finish_then_closes() -> None:
    async def body() -> None:
        service = Service()
        peer = Peer(service)
        stream_id = peer.start("/t.S/Stream", end=False)
        call = await service.next_call()
        peer.conn.go_away()
        await peer.let_go()
        assert peer.terminated is not None and peer.terminated.error_code == H2Error.NO_ERROR
        assert peer.goaways() == [(stream_id, H2Error.NO_ERROR)]
        assert not peer.output.closed
        writes = len(peer.output.writes)
        # h2 sends nothing more after a GOAWAY, and reads nothing: raw bytes both ways.
        peer.conn.receive(frame(FrameType.DATA, END_STREAM, stream_id))
        await finished(call)
        assert peer.output.closed
        reader = FrameCollector(1 << 20, 1 << 16)
        sent = reader.frames(PREFACE + b"".join(peer.output.writes[writes:]))
        assert [(f.kind, f.stream_id, f.flags & END_STREAM) for f in sent] == \
            [(FrameType.HEADERS, stream_id, END_STREAM)]
        assert call.cancellation.reason is None
        assert forgotten(peer)
    run(body())




def test_frames_of_unknown_types_are_ignored_and_calls_go_on() -> None:
    """RFC 9113 §4.1: a frame of a type the endpoint does not know is ignored, whatever its
    type number (just past the known ones, or far past them)."""
    async def body() -> None:
        service = Service()
        peer = Peer(service)
        peer.pump()
        peer.raw(frame(0x0A, 0, 0, b"extension") + frame(0xEE, 0, 1, b"x"))
        assert not peer.output.closed
        stream_id = peer.start("/t.S/Echo", Request(model_name="m", id="7"))
        await finished(await service.next_call())
        peer.collect()
        assert peer.ended(stream_id).status == GrpcStatus.OK
    run(body())


# -- the usual unary call's one-step paths against the general ones -----------------------
def _snapshot(peer: Peer, call: Call) -> dict[str, Any]:
    """Everything the transport keeps that a unary call moves, and what the client got."""
    inbound, conn = peer.conn.inbound, peer.conn
    return {
        "written": b"".join(peer.output.writes), "held": inbound.held,
        "reserved": inbound.reserved, "credit": inbound.window.available,
        "size": inbound._size, "budget": inbound._budget.held,
        "send_window": conn.control.send_window.size, "calls": sorted(conn.calls),
        "all_calls": len(peer.all_calls), "state": call.state, "withheld": call.withheld,
        "call_held": call.held, "call_credit": call.recv_window.available,
        "call_send_window": call.send_window.size, "headers_sent": call.headers_sent,
        "timer": call.timer is not None, "messages": len(call.messages),
        "partial": call.reader.partial, "pending": len(call.pending),
        "reason": call.cancellation.reason, "task": call.task is not None,
    }


ONE_STEP_CASES = {
    "plain": (GrpcLimits(), 10, ()),
    "deadline": (GrpcLimits(), 10, (("grpc-timeout", "5S"),)),
    # Requests that use half the connection's window in two turns: the client's credit is
    # topped up (a reply of the same size still fits one frame).
    "grants": (GrpcLimits(connection_window=70000), 16000, ()),
    # A budget with no room: grants wait, and are retried as requests are taken.
    "starved budget": (GrpcLimits(connection_window=70000, max_buffered_bytes=30000), 16000,
                       ()),
}


@pytest.mark.parametrize("case", ONE_STEP_CASES)
def test_usual_unary_call_one_step_paths_match_the_general_ones(
        case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    limits, size, headers = ONE_STEP_CASES[case]

    async def served() -> list[dict[str, Any]]:
        service = Service()
        peer = Peer(service, limits)
        peer.pump()
        peer.pump()  # settings both ways: the client sends a message in one frame
        seen = []
        for turn in range(4):
            stream_id = peer.start("/t.S/Echo", Request(id=str(turn) * size), headers=headers,
                                   end_with_data=True)
            call = peer.conn.calls[stream_id]
            seen.append(_snapshot(peer, call))  # the request taken, its handler not run yet
            await finished(await service.next_call())
            peer.collect()
            assert peer.ended(stream_id).status == GrpcStatus.OK
            seen.append(_snapshot(peer, call))
            peer.h2.acknowledge_received_data(len(peer.replies[stream_id].data), stream_id)
        return seen

    taken: list[str] = []
    whole_request, whole_reply = Inbound._whole_request, Outbox.whole_reply

    def one_step_request(self: Inbound, call: Call, payload: memoryview, size: int) -> None:
        taken.append("request")
        whole_request(self, call, payload, size)

    def one_step_reply(self: Outbox, call: Call, pieces: list[Chunk], size: int) -> bool:
        done = whole_reply(self, call, pieces, size)
        taken.append("reply" if done else "general reply")
        return done

    with monkeypatch.context() as patched:
        patched.setattr(Inbound, "_whole_request", one_step_request)
        patched.setattr(Outbox, "whole_reply", one_step_reply)
        fast = asyncio.run(served())
    assert taken == ["request", "reply"] * 4

    def general_request(self: Inbound, call: Call, payload: memoryview, size: int) -> None:
        self._on_call_data(call, END_STREAM, payload, size)

    with monkeypatch.context() as patched:
        patched.setattr(Inbound, "_whole_request", general_request)
        patched.setattr(Outbox, "whole_reply", lambda *_: False)
        general = asyncio.run(served())
    assert fast == general
