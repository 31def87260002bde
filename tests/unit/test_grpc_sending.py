"""Outbox: the frames a reply becomes, byte for byte what http2.frame makes of them."""

from __future__ import annotations

from typing import cast

from tritium.core.cancellation import Cancellation
from tritium.frontends.grpc.call import Call, Rpc
from tritium.frontends.grpc.connection import GrpcConnection
from tritium.frontends.grpc.http2 import END_HEADERS, END_STREAM, FrameType, frame
from tritium.frontends.grpc.sending import Outbox
from tritium.frontends.grpc.windows import SendWindow
from tritium.frontends.grpc.wire import OK_TRAILERS, RESPONSE_HEADERS


def a_call(stream_id: int, window: int = 1 << 20) -> Call:
    conn = cast(GrpcConnection, None)
    return Call(conn, stream_id, Rpc(object), "identity", {}, window, window, 1 << 20,
                cast(Cancellation, None))


def test_a_small_reply_is_headers_data_and_trailers_as_http2_frames_them() -> None:
    flushed: list[Call] = []
    outbox = Outbox(SendWindow(1 << 20), flushed.append)
    call = a_call(7)
    outbox.data(call, b"\x00\x00\x00\x00\x03abc")
    outbox.trailers(call, OK_TRAILERS)
    assert outbox.out == [
        frame(FrameType.HEADERS, END_HEADERS, 7, RESPONSE_HEADERS),
        frame(FrameType.DATA, 0, 7, b"\x00\x00\x00\x00\x03abc"),
        frame(FrameType.HEADERS, END_HEADERS | END_STREAM, 7, OK_TRAILERS),
    ]
    assert flushed == [call]


def test_a_reply_over_the_window_waits_and_its_trailers_follow_it() -> None:
    flushed: list[Call] = []
    window = SendWindow(4)
    outbox = Outbox(window, flushed.append)
    call = a_call(9)
    outbox.data(call, memoryview(b"abcdefgh"))
    outbox.trailers(call, OK_TRAILERS)
    assert b"".join(outbox.out[1:]) == frame(FrameType.DATA, 0, 9, b"abcd")
    assert flushed == [] and outbox.blocked == {9: call}
    outbox.out.clear()
    window.size += 4
    outbox.pump_blocked()
    assert b"".join(outbox.out) == frame(FrameType.DATA, 0, 9, b"efgh") + \
        frame(FrameType.HEADERS, END_HEADERS | END_STREAM, 9, OK_TRAILERS)
    assert flushed == [call]
