"""The HTTP/2 frame reader, fed bytes in every shape a socket can hand them over."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tritium.frontends.grpc.frames import (
    MAX_CONTINUATIONS,
    Frame,
    FrameCollector,
    FrameReader,
    Handler,
    NotHttp2,
)
from tritium.frontends.grpc.http2 import (
    ACK,
    END_HEADERS,
    END_STREAM,
    PADDED,
    PREFACE,
    PRIORITY,
    FrameType,
    H2Error,
    ProtocolViolation,
    frame,
    rst_stream,
    window_update,
)

MAX_FRAME = 16384
MAX_BLOCK = 4096
Seen = tuple[int, int, int, bytes]


def reader() -> FrameCollector:
    return FrameCollector(MAX_FRAME, MAX_BLOCK)


def seen(frames: list[Frame]) -> list[Seen]:
    return [(f.kind, f.flags, f.stream_id, bytes(f.payload)) for f in frames]


def after_preface() -> FrameCollector:
    found = reader()
    assert found.frames(PREFACE) == []
    assert found.preface_seen
    return found


def violation(found: FrameCollector, data: bytes) -> H2Error:
    with pytest.raises(ProtocolViolation) as caught:
        found.frames(data)
    return caught.value.code


# A mix of frames, a DATA frame larger than a read, and one with no payload.
STREAM = b"".join([
    frame(FrameType.SETTINGS, 0, 0, b"\x00\x04\x00\x01\x00\x00"),
    frame(FrameType.SETTINGS, ACK, 0),
    frame(FrameType.HEADERS, END_HEADERS, 1, b"block-of-one"),
    frame(FrameType.DATA, 0, 1, bytes(range(256)) * 20),
    frame(FrameType.DATA, END_STREAM, 1),
    window_update(0, 1000),
    frame(FrameType.HEADERS, 0, 3, b"first-"),
    frame(FrameType.CONTINUATION, 0, 3, b"second-"),
    frame(FrameType.CONTINUATION, END_HEADERS, 3, b"third"),
    rst_stream(3, H2Error.CANCEL),
    frame(FrameType.PING, 0, 0, b"12345678"),
])


def test_preface_in_pieces() -> None:
    found = reader()
    for byte in PREFACE[:-1]:
        assert found.frames(bytes([byte])) == []
        assert not found.preface_seen
    assert found.frames(PREFACE[-1:]) == []
    assert found.preface_seen


def test_preface_and_frames_in_one_read() -> None:
    expected = seen(after_preface().frames(STREAM))
    assert seen(reader().frames(PREFACE + STREAM)) == expected
    assert len(expected) == 9


def test_wrong_preface_is_not_http2_and_keeps_the_first_bytes() -> None:
    with pytest.raises(NotHttp2) as caught:
        reader().frames(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert caught.value.start == b"GET / HTTP/1.1\r\n"


def test_wrong_preface_found_across_reads() -> None:
    found = reader()
    assert found.frames(b"PRI * HT") == []
    with pytest.raises(NotHttp2) as caught:
        found.frames(b"TP/1.1\r\n")
    assert caught.value.start == b"PRI * HTTP/1.1\r\n"


def test_one_byte_at_a_time_gives_the_same_frames() -> None:
    whole = seen(after_preface().frames(STREAM))
    found = reader()
    pieces: list[Frame] = []
    for byte in PREFACE + STREAM:
        pieces += found.frames(bytes([byte]))
    assert seen(pieces) == whole


def test_split_at_every_byte_boundary() -> None:
    whole = seen(after_preface().frames(STREAM))
    for cut in range(len(STREAM) + 1):
        found = after_preface()
        frames = found.frames(STREAM[:cut]) + found.frames(STREAM[cut:])
        assert seen(frames) == whole, cut


def test_each_frame_goes_to_the_handler_of_its_type_and_unknown_types_are_ignored() -> None:
    handled: list[tuple[str, int, int, bytes]] = []
    opened: list[bool] = []

    def handler(name: str) -> Handler:
        return lambda flags, stream_id, payload: handled.append(
            (name, flags, stream_id, bytes(payload)))
    found = FrameReader(MAX_FRAME, MAX_BLOCK, {
        FrameType.DATA: handler("data"), FrameType.HEADERS: handler("headers")},
        on_preface=lambda: opened.append(handled == []))
    found.feed(PREFACE + frame(FrameType.HEADERS, END_HEADERS | END_STREAM, 1, b"h")
               + window_update(0, 5) + frame(0xEE, 0, 1, b"x")
               + frame(FrameType.DATA, END_STREAM, 1 | 1 << 31, b"d"))
    assert opened == [True]  # before any frame is handed on
    assert handled == [("headers", END_HEADERS | END_STREAM, 1, b"h"),
                       ("data", END_STREAM, 1, b"d")]  # the reserved bit dropped


def test_after_stop_no_frame_is_handed_on_not_even_the_rest_of_the_read() -> None:
    handled: list[int] = []
    found: FrameReader

    def on_ping(flags: int, stream_id: int, payload: memoryview) -> None:
        handled.append(flags)
        found.stop()
    found = FrameReader(MAX_FRAME, MAX_BLOCK, {FrameType.PING: on_ping})
    found.feed(PREFACE + frame(FrameType.PING, 0, 0, bytes(8)) + frame(FrameType.PING, ACK, 0,
                                                                        bytes(8)))
    found.feed(frame(FrameType.PING, 0, 0, bytes(8)))
    assert handled == [0]
    assert not found.in_header_block


def test_a_stop_inside_a_header_block_leaves_no_error_for_what_follows() -> None:
    found = after_preface()
    found.frames(frame(FrameType.HEADERS, 0, 1, b"h"))
    assert found.in_header_block
    found.stop()
    assert not found.in_header_block
    assert found.frames(frame(FrameType.DATA, 0, 1, b"d")) == []  # not "interrupted"


def test_frames_with_no_payload_and_reads_of_nothing() -> None:
    found = after_preface()
    assert found.frames(b"") == []
    assert seen(found.frames(frame(FrameType.SETTINGS, ACK, 0))) == [
        (FrameType.SETTINGS, ACK, 0, b"")]


def test_frame_over_max_frame_is_frame_size_error_from_its_header() -> None:
    header = frame(FrameType.DATA, 0, 1, bytes(MAX_FRAME + 1))[:9]
    assert violation(after_preface(), header) == H2Error.FRAME_SIZE_ERROR


def test_frame_of_exactly_max_frame_is_taken() -> None:
    data = frame(FrameType.DATA, 0, 1, bytes(MAX_FRAME))
    assert seen(after_preface().frames(data)) == [(FrameType.DATA, 0, 1, bytes(MAX_FRAME))]


def test_reserved_bit_of_stream_id_is_ignored() -> None:
    data = bytearray(frame(FrameType.DATA, 0, 5, b"x"))
    data[5] |= 0x80
    assert seen(after_preface().frames(bytes(data))) == [(FrameType.DATA, 0, 5, b"x")]


def test_continuations_joined_into_one_headers_frame() -> None:
    found = after_preface()
    assert found.frames(frame(FrameType.HEADERS, END_STREAM, 1, b"abc")) == []
    assert found.in_header_block
    assert found.frames(frame(FrameType.CONTINUATION, 0, 1, b"def")) == []
    frames = found.frames(frame(FrameType.CONTINUATION, END_HEADERS, 1, b"ghi"))
    assert seen(frames) == [(FrameType.HEADERS, END_STREAM | END_HEADERS, 1, b"abcdefghi")]
    assert not found.in_header_block


def test_padding_and_priority_removed_from_headers() -> None:
    priority = b"\x00\x00\x00\x03\x10"
    payload = b"\x04" + priority + b"block" + b"\x00" * 4
    data = frame(FrameType.HEADERS, END_HEADERS | PADDED | PRIORITY, 1, payload)
    assert seen(after_preface().frames(data)) == [
        (FrameType.HEADERS, END_HEADERS | PADDED | PRIORITY, 1, b"block")]


def test_padded_headers_then_continuation() -> None:
    found = after_preface()
    assert found.frames(frame(FrameType.HEADERS, PADDED, 1, b"\x02abc\x00\x00")) == []
    frames = found.frames(frame(FrameType.CONTINUATION, END_HEADERS, 1, b"def"))
    assert seen(frames)[0][3] == b"abcdef"


def test_padding_longer_than_the_frame_is_protocol_error() -> None:
    data = frame(FrameType.HEADERS, END_HEADERS | PADDED, 1, b"\x05abc")
    assert violation(after_preface(), data) == H2Error.PROTOCOL_ERROR


def test_truncated_priority_is_frame_size_error() -> None:
    data = frame(FrameType.HEADERS, END_HEADERS | PRIORITY, 1, b"\x00\x00")
    assert violation(after_preface(), data) == H2Error.FRAME_SIZE_ERROR


def test_headers_on_stream_zero_is_protocol_error() -> None:
    assert violation(after_preface(), frame(FrameType.HEADERS, END_HEADERS, 0, b"x")) == \
        H2Error.PROTOCOL_ERROR


def test_continuation_on_another_stream_is_protocol_error() -> None:
    found = after_preface()
    found.frames(frame(FrameType.HEADERS, 0, 1, b"abc"))
    assert violation(found, frame(FrameType.CONTINUATION, END_HEADERS, 3, b"d")) == \
        H2Error.PROTOCOL_ERROR


def test_header_block_interrupted_by_another_frame_is_protocol_error() -> None:
    found = after_preface()
    found.frames(frame(FrameType.HEADERS, 0, 1, b"abc"))
    assert violation(found, frame(FrameType.PING, 0, 0, b"12345678")) == H2Error.PROTOCOL_ERROR


def test_continuation_alone_is_protocol_error() -> None:
    assert violation(after_preface(), frame(FrameType.CONTINUATION, END_HEADERS, 1, b"x")) == \
        H2Error.PROTOCOL_ERROR


def test_continuation_after_a_finished_block_is_protocol_error() -> None:
    found = after_preface()
    found.frames(frame(FrameType.HEADERS, END_HEADERS, 1, b"abc"))
    assert violation(found, frame(FrameType.CONTINUATION, END_HEADERS, 1, b"x")) == \
        H2Error.PROTOCOL_ERROR


def test_as_many_continuations_as_allowed_are_joined() -> None:
    found = after_preface()
    found.frames(frame(FrameType.HEADERS, 0, 1, b"h"))
    for _ in range(MAX_CONTINUATIONS - 1):
        assert found.frames(frame(FrameType.CONTINUATION, 0, 1, b"c")) == []
    frames = found.frames(frame(FrameType.CONTINUATION, END_HEADERS, 1, b"e"))
    assert seen(frames)[0][3] == b"h" + b"c" * (MAX_CONTINUATIONS - 1) + b"e"


def test_too_many_continuations_is_enhance_your_calm() -> None:
    found = after_preface()
    found.frames(frame(FrameType.HEADERS, 0, 1, b"h"))
    for _ in range(MAX_CONTINUATIONS):
        found.frames(frame(FrameType.CONTINUATION, 0, 1, b""))
    assert violation(found, frame(FrameType.CONTINUATION, 0, 1, b"")) == \
        H2Error.ENHANCE_YOUR_CALM


def test_too_large_a_header_block_is_enhance_your_calm() -> None:
    found = after_preface()
    found.frames(frame(FrameType.HEADERS, 0, 1, bytes(MAX_BLOCK - 10)))
    assert violation(found, frame(FrameType.CONTINUATION, 0, 1, bytes(11))) == \
        H2Error.ENHANCE_YOUR_CALM


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=2048), cuts=st.lists(st.integers(0, 2048), max_size=8))
def test_arbitrary_bytes_give_frames_or_a_protocol_violation(data: bytes,
                                                             cuts: list[int]) -> None:
    found = after_preface()
    bounds = sorted({0, len(data), *(cut for cut in cuts if cut < len(data))})
    try:
        for start, end in itertools.pairwise(bounds):
            for got in found.frames(data[start:end]):
                assert 0 <= got.stream_id < 2**31
                assert len(got.payload) <= MAX_FRAME
                assert got.kind != FrameType.CONTINUATION
    except ProtocolViolation:
        pass


@settings(max_examples=200, deadline=None)
@given(frames=st.lists(st.tuples(st.sampled_from(list(FrameType)), st.integers(0, 255),
                                 st.integers(0, 7), st.binary(max_size=64)), max_size=12))
def test_well_framed_garbage_gives_frames_or_a_protocol_violation(
        frames: list[tuple[FrameType, int, int, bytes]]) -> None:
    # Arbitrary bytes rarely form a frame header with a small length; these always do.
    found = after_preface()
    try:
        for kind, flags, stream_id, payload in frames:
            found.frames(frame(kind, flags, stream_id, payload))
    except ProtocolViolation:
        pass
