"""HTTP/2 and gRPC wire helpers (``http2.py``, ``wire.py``, ``messages.py``), with no server."""

from __future__ import annotations

import asyncio
import gzip
import zlib

import hpack
import pytest

from tritium.frontends.grpc.http2 import (
    ACK,
    END_HEADERS,
    END_STREAM,
    PADDED,
    FrameType,
    H2Error,
    ProtocolViolation,
    Setting,
    frame,
    goaway,
    parse_settings,
    references_only,
    rst_stream,
    settings_payload,
    strip_padding,
    window_update,
)
from tritium.frontends.grpc.messages import BufferExhausted, inflate
from tritium.frontends.grpc.wire import encode_status_message, parse_timeout


def split_frame(data: bytes) -> tuple[int, int, int, int, bytes]:
    """(length, type, flags, stream id, payload) of one whole frame, read per RFC 9113 §4.1."""
    length = int.from_bytes(data[:3], "big")
    stream_id = int.from_bytes(data[5:9], "big")
    assert not stream_id & 0x80000000, "reserved bit set"
    assert len(data) == 9 + length
    return length, data[3], data[4], stream_id, data[9:]


# -- frames ----------------------------------------------------------------------------------


@pytest.mark.parametrize("payload", [b"", b"x", b"\x00" * 16384, b"y" * (2**20)])
def test_frame_layout_round_trips(payload: bytes) -> None:
    raw = frame(FrameType.DATA, END_STREAM | PADDED, 0x7FFFFFFF, payload)
    assert split_frame(raw) == (len(payload), FrameType.DATA, END_STREAM | PADDED,
                                0x7FFFFFFF, payload)


def test_frame_header_bytes_are_exact() -> None:
    raw = frame(FrameType.HEADERS, END_HEADERS | END_STREAM, 3, b"abc")
    assert raw == b"\x00\x00\x03" + b"\x01" + b"\x05" + b"\x00\x00\x00\x03" + b"abc"


def test_window_update_rst_stream_and_goaway() -> None:
    assert split_frame(window_update(5, 65535)) == (
        4, FrameType.WINDOW_UPDATE, 0, 5, (65535).to_bytes(4, "big"))
    assert split_frame(rst_stream(7, H2Error.CANCEL)) == (
        4, FrameType.RST_STREAM, 0, 7, (8).to_bytes(4, "big"))
    _, kind, flags, stream_id, payload = split_frame(goaway(9, H2Error.FRAME_SIZE_ERROR, "big"))
    assert (kind, flags, stream_id) == (FrameType.GOAWAY, 0, 0)
    assert payload == (9).to_bytes(4, "big") + (6).to_bytes(4, "big") + b"big"


# -- settings --------------------------------------------------------------------------------


def test_settings_round_trip() -> None:
    values = {Setting.MAX_CONCURRENT_STREAMS: 4096, Setting.INITIAL_WINDOW_SIZE: 2**31 - 1,
              Setting.MAX_FRAME_SIZE: 1 << 20, Setting.ENABLE_PUSH: 0}
    payload = settings_payload(values)
    assert len(payload) == 6 * len(values)
    assert payload[:6] == b"\x00\x03" + (4096).to_bytes(4, "big")
    assert parse_settings(payload) == {int(k): v for k, v in values.items()}


def test_empty_settings() -> None:
    assert settings_payload({}) == b""
    assert parse_settings(b"") == {}


def test_unknown_setting_is_kept_and_last_value_wins() -> None:
    payload = (b"\x00\x04" + (100).to_bytes(4, "big") + b"\xff\x00" + (1).to_bytes(4, "big")
               + b"\x00\x04" + (200).to_bytes(4, "big"))
    assert parse_settings(payload) == {4: 200, 0xFF00: 1}


@pytest.mark.parametrize("length", [1, 5, 7, 11])
def test_settings_length_not_a_multiple_of_6(length: int) -> None:
    with pytest.raises(ProtocolViolation) as info:
        parse_settings(b"\x00" * length)
    assert info.value.code == H2Error.FRAME_SIZE_ERROR


# -- padding ---------------------------------------------------------------------------------


def test_strip_padding_without_the_flag_is_identity() -> None:
    assert strip_padding(b"\x05hello", END_STREAM) == b"\x05hello"


@pytest.mark.parametrize(("payload", "content"), [
    (b"\x00hello", b"hello"),
    (b"\x03hello\x00\x00\x00", b"hello"),
    (b"\x02\x00\x00", b""),
    (b"\x00", b""),
])
def test_strip_padding(payload: bytes, content: bytes) -> None:
    assert strip_padding(payload, PADDED | END_STREAM) == content


@pytest.mark.parametrize("payload", [b"", b"\x01", b"\x05abc", b"\x04abc", b"\xff" + b"a" * 10])
def test_padding_longer_than_the_frame(payload: bytes) -> None:
    with pytest.raises(ProtocolViolation) as info:
        strip_padding(payload, PADDED)
    assert info.value.code == H2Error.PROTOCOL_ERROR


def test_ack_shares_the_end_stream_bit() -> None:
    assert ACK == END_STREAM == 0x1


# -- grpc-timeout ----------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "seconds"), [
    ("2H", 7200.0),
    ("3M", 180.0),
    ("5S", 5.0),
    ("300m", 0.3),
    ("250u", 250e-6),
    ("100n", 100e-9),
    ("0S", 0.0),
    ("99999999S", 99999999.0),
    ("00000001m", 0.001),
])
def test_parse_timeout(value: str, seconds: float) -> None:
    assert parse_timeout(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", [
    "", "5", "S", "123456789S", "5x", "-5S", "+5S", "5 S", " 5S", "5s", "1.5S", "5SS", "0x5S",
])
def test_malformed_timeout(value: str) -> None:
    with pytest.raises(ValueError, match="grpc-timeout"):
        parse_timeout(value)


def test_latin1_superscript_digit_is_malformed() -> None:
    # Header values reach parse_timeout decoded as latin-1, where '\xb2' is a "digit".
    with pytest.raises(ValueError):
        parse_timeout("\xb2S")


def test_non_ascii_digits_are_malformed() -> None:
    with pytest.raises(ValueError):
        parse_timeout("\u0665S")


# -- grpc-message ----------------------------------------------------------------------------


def test_status_message_ascii_is_unchanged() -> None:
    text = "model 'x' has no input named \"INPUT9\" [0-9]~{}"
    assert encode_status_message(text) == text.encode()


def test_status_message_escapes_percent() -> None:
    assert encode_status_message("100% done") == b"100%25 done"


def test_status_message_escapes_utf8_bytes() -> None:
    assert encode_status_message("caf\u00e9 \u2603") == b"caf%C3%A9 %E2%98%83"


def test_status_message_escapes_control_characters() -> None:
    assert encode_status_message("a\nb\r\tc\x7f") == b"a%0Ab%0D%09c%7F"


def test_status_message_survives_lone_surrogates() -> None:
    assert encode_status_message("x\ud800y") == b"x?y"


def test_status_message_decodes_back() -> None:
    from urllib.parse import unquote

    text = "100% \u00fcber\nline \u2603 done"
    assert unquote(encode_status_message(text).decode("ascii")) == text


# -- decompression ---------------------------------------------------------------------------

MESSAGE = b"tritium " * 1000


def decompress(data: bytes, encoding: str, limit: int) -> bytes:
    return bytes(asyncio.run(inflate(data, encoding, limit)))


def test_a_message_of_many_steps_is_joined_whole() -> None:
    """More than one 4 MiB step: the pieces are joined into one buffer, in order."""
    message = bytes(range(256)) * (40_000)  # ~10 MiB
    assert decompress(gzip.compress(message, 1), "gzip", 1 << 30) == message


def test_each_step_is_counted_and_a_refusal_ends_the_inflation() -> None:
    """``hold`` is asked for every step's bytes; when it says no, the inflation stops with
    BufferExhausted (a ValueError) before inflating more."""
    counted: list[int] = []

    def hold(count: int) -> bool:
        counted.append(count)
        return sum(counted) <= 5 << 20

    bomb = gzip.compress(bytes(64 << 20))
    with pytest.raises(BufferExhausted, match="does not fit"):
        asyncio.run(inflate(bomb, "gzip", 1 << 30, hold))
    assert sum(counted) <= 12 << 20  # stopped after the step that did not fit
    counted.clear()
    assert decompress(gzip.compress(MESSAGE), "gzip", 1 << 20) == MESSAGE
    assert bytes(asyncio.run(inflate(gzip.compress(MESSAGE), "gzip", 1 << 20, hold))) == MESSAGE
    assert sum(counted) == len(MESSAGE)


def test_gzip_round_trip() -> None:
    assert decompress(gzip.compress(MESSAGE), "gzip", 1 << 20) == MESSAGE


def test_deflate_round_trip() -> None:
    # gRPC's "deflate" is the zlib format (RFC 1950), as grpc-core and grpc-java send it.
    assert decompress(zlib.compress(MESSAGE), "deflate", 1 << 20) == MESSAGE


def test_empty_messages_decompress() -> None:
    assert decompress(gzip.compress(b""), "gzip", 0) == b""
    assert decompress(zlib.compress(b""), "deflate", 0) == b""


@pytest.mark.parametrize("encoding", ["identity", "br", "snappy", "GZIP", ""])
def test_unknown_encoding(encoding: str) -> None:
    with pytest.raises(ValueError, match="unsupported encoding"):
        decompress(gzip.compress(MESSAGE), encoding, 1 << 20)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_corrupt_data(encoding: str) -> None:
    with pytest.raises(ValueError, match="corrupt"):
        decompress(b"this is not compressed at all", encoding, 1 << 20)


def test_gzip_with_a_bad_header_is_corrupt() -> None:
    data = bytearray(gzip.compress(MESSAGE))
    data[2] = 0x07  # compression method other than deflate
    with pytest.raises(ValueError, match="corrupt"):
        decompress(bytes(data), "gzip", 1 << 20)


def test_zlib_stream_is_not_gzip() -> None:
    with pytest.raises(ValueError, match="corrupt"):
        decompress(zlib.compress(MESSAGE), "gzip", 1 << 20)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_result_at_the_limit_is_accepted(encoding: str) -> None:
    data = gzip.compress(MESSAGE) if encoding == "gzip" else zlib.compress(MESSAGE)
    assert decompress(data, encoding, len(MESSAGE)) == MESSAGE


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_result_over_the_limit(encoding: str) -> None:
    data = gzip.compress(MESSAGE) if encoding == "gzip" else zlib.compress(MESSAGE)
    with pytest.raises(ValueError, match="larger than"):
        decompress(data, encoding, len(MESSAGE) - 1)


def test_decompression_bomb_is_stopped_at_the_limit() -> None:
    bomb = gzip.compress(b"\x00" * (64 << 20))  # 64 MiB of zeros in ~64 KiB
    assert len(bomb) < 1 << 20
    with pytest.raises(ValueError, match="larger than 4096"):
        decompress(bomb, "gzip", 4096)


@pytest.mark.parametrize(("encoding", "cut"), [
    ("gzip", 0.5), ("gzip", -4), ("deflate", 0.5), ("deflate", -2),
])
def test_truncated_data_is_corrupt(encoding: str, cut: float) -> None:
    data = gzip.compress(MESSAGE) if encoding == "gzip" else zlib.compress(MESSAGE)
    end = int(len(data) * cut) if cut > 0 else len(data) + int(cut)
    with pytest.raises(ValueError):
        decompress(data[:end], encoding, 1 << 20)


# ------------------------------------------------------------------ references_only
def test_references_only_blocks() -> None:
    encoder = hpack.Encoder()
    headers = [(b":method", b"POST"), (b":path", b"/a/B"), (b"te", b"trailers")]
    first = encoder.encode(headers)
    assert not references_only(first)  # new entries are added to the table
    assert references_only(encoder.encode(headers))  # now all indexed
    assert references_only(b"")
    assert references_only(bytes([0x82, 0xFF, 0x80, 0x01]))  # a multi-byte index
    assert not references_only(bytes([0x82, 0x3F, 0xE1, 0x1F]))  # a table size update
    assert not references_only(bytes([0x82, 0x04, 0x01, 0x61]))  # literal, not indexed
