"""Outbox: the frames a reply becomes, byte for byte what http2.frame makes of them."""

from __future__ import annotations

from typing import cast

from tritium.core.cancellation import Cancellation
from tritium.frontends.grpc.call import Call, Rpc
from tritium.frontends.grpc.connection import GrpcConnection
from tritium.frontends.grpc.http2 import (
    DEFAULT_MAX_FRAME,
    END_HEADERS,
    END_STREAM,
    Chunk,
    FrameType,
    frame,
)
from tritium.frontends.grpc.sending import Outbox
from tritium.frontends.grpc.windows import SendWindow
from tritium.frontends.grpc.wire import OK_TRAILERS, RESPONSE_HEADERS, message_of


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


def test_a_whole_reply_at_once_is_the_frames_of_data_then_trailers() -> None:
    pieces: list[Chunk] = [b"\x0a\x03abc", memoryview(b"\x12\x01z")]
    size = sum(map(len, pieces))
    general = Outbox(SendWindow(1 << 20), lambda call: None)
    flushed: list[Call] = []
    general_call = a_call(11)
    general.data(general_call, message_of(pieces, size))
    general.trailers(general_call, OK_TRAILERS)
    at_once = Outbox(SendWindow(1 << 20), flushed.append)
    call = a_call(11)
    assert at_once.whole_reply(call, pieces, size)
    assert b"".join(at_once.out) == b"".join(general.out)
    assert call.headers_sent and not call.pending and not at_once.blocked
    assert (at_once.window.size, call.send_window.size) == \
        (general.window.size, general_call.send_window.size)
    assert flushed == []  # the caller closes the call


def test_a_reply_that_does_not_fit_at_once_is_left_to_the_general_path() -> None:
    def refused(call: Call, connection_window: int, size: int) -> None:
        outbox = Outbox(SendWindow(connection_window), lambda call: None)
        assert not outbox.whole_reply(call, [bytes(size)], size)
        assert outbox.out == [] and outbox.window.size == connection_window
    refused(a_call(1), 1 << 20, DEFAULT_MAX_FRAME - 4)  # over one frame with its prefix
    refused(a_call(1), 104, 100)  # over the connection's window
    refused(a_call(1, window=104), 1 << 20, 100)  # over the stream's
    sent = a_call(1)
    sent.headers_sent = True  # the handler wrote already
    refused(sent, 1 << 20, 10)
