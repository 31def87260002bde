"""The one codec of the instance channel: every message round-trips by name, and what is
not exactly a message is refused (FrameError), never built or run."""

from __future__ import annotations

import asyncio
import pickle
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from tritium.core.config_pb import model_config_pb2
from tritium.core.errors import ErrorCode, TritiumError
from tritium.execution.backend import InstanceInfo
from tritium.execution.process import autocomplete, bls, wire
from tritium.execution.process import messages as msg
from tritium.execution.process.codec import (
    FrameError,
    FrameReader,
    convert,
    decode,
    encode,
    pack_value,
    unpack_value,
)

PACKED = msg.Packed(128, [msg.TensorDesc("INPUT0", 8, (2, 3), 0, 24)])
MESSAGES: list[Any] = [
    msg.Init(InstanceInfo("m", 1, "/r/m", "{}", "m_0", "CPU", 0), 1 << 30, 1 << 20, 64,
             [0, 1]),
    msg.Execute(7, [msg.RequestDesc(3, "id", "seq-1", 0, 0, {"p": 1.5, "q": True}, None,
                                    "m", 1)], PACKED),
    msg.Stop(),
    msg.Reply(1, {"k": [1, "two"]}, msg.EMPTY, True),
    msg.ReplyError(2, msg.ErrorBody("NOT_FOUND", "no such model")),
    msg.Ready(False, True, 1234),
    msg.InitFailed(msg.ErrorBody("INTERNAL", "boom")),
    msg.Responses([msg.ResponseBody(3, True, parameters={"a": "b"}, tensors=PACKED)]),
    msg.Done(7, 1000, [msg.ResponseBody(3, False, error=msg.ErrorBody("INTERNAL", "x"))],
             [msg.Released(3, 2)], [4]),
    msg.Call(9, "bls.exec", None,
             msg.Packed(-1, [msg.TensorDesc("", 2, (6,), 0, 6, memoryview(b"inline"))]), [3]),
    msg.CallCancel(9),
    msg.Stopped(),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(message: Any) -> None:
    reader = FrameReader()
    reader.feed(encode(message))
    (body,) = reader.bodies(10)
    assert decode(body) == message


@pytest.mark.parametrize("wire", [
    [99],  # no such message
    [13, "7", 0, [], []],  # a batch id that is not an int
    [13, True, 0, [], []],  # a bool is not an int
    [15],  # too few fields
    [15, 1, 2],  # too many
    [2, 1, [[3, "id", 1.5, 0, 0, {}, None, "m", 1]], [-1, [], None]],  # a float correlation id
    [12, [[3, True, False, ["NOT_FOUND"], None, None]]],  # an error body missing its text
    {"tag": 1},  # not an array
    [2, 1, [], [-1, [["I", 8, [2, "3"], 0, 24]], None]],  # a shape of a string
    [2, 1, [], [-1, [["I", 8, {"2": 3}, 0, 24]], None]],  # a shape that is no array
    [2, 1, [[3, "id", 0, 0, 0, {}, ["o", 1], "m", 1]], [-1, [], None]],  # an output not a str
    [2, 1, [[3, "id", 0, 0, 0, {}, "o", "m", 1]], [-1, [], None]],  # outputs not an array
    [2, 1, [[3, "id", 0, 0, 0, {1: 2}, None, "m", 1]], [-1, [], None]],  # a parameter key
    [2, 1, [7], [-1, [], None]],  # a request that is not an array
], ids=str)
def test_what_is_not_a_message_is_refused(wire: Any) -> None:
    with pytest.raises(FrameError):
        decode(msgspec.msgpack.encode(wire))


def test_a_pickle_is_not_decoded() -> None:
    with pytest.raises(FrameError):
        decode(pickle.dumps((14, 1, "x", None, None, [])))


def test_an_oversized_length_is_refused_before_its_body() -> None:
    reader = FrameReader()
    reader.feed((1 << 31).to_bytes(4, "little"))
    with pytest.raises(FrameError, match="over the limit"):
        reader.bodies(1)


def test_errors_cross_in_one_shape() -> None:
    body = msg.ErrorBody.of(TritiumError(ErrorCode.UNAVAILABLE, "busy"))
    assert body.error().code is ErrorCode.UNAVAILABLE and body.error().message == "busy"
    other = msg.ErrorBody.of(ValueError("bad"))
    assert other == msg.ErrorBody("INTERNAL", "ValueError: bad")
    assert msg.ErrorBody("NO_SUCH_CODE", "t").error().code is ErrorCode.INTERNAL
    assert convert(msg.ErrorBody, ["INTERNAL", "t"]) == msg.ErrorBody("INTERNAL", "t")


# -- the payloads of calls -------------------------------------------------------------

HEADER: list[Any] = ["INPUT0", "FP32", [4]]
REQUEST: list[Any] = ["m", None, "id", [HEADER], None, {"p": 1}, 0, 0, 0, None]  # a BlsRequest
RESPONSE: list[Any] = [[HEADER], {}, None, True, False]  # a BlsResponse
PAYLOADS: list[Any] = [
    msg.BlsRequest("m", 2, "r1", [msg.TensorHeader("INPUT0", "FP32", (2, 3))], ["OUT"],
                   {"s": "x", "i": 1, "f": 0.5, "b": True}, "seq", 3, 250, 7),
    msg.BlsResponse([msg.TensorHeader("OUTPUT0", "BYTES", (1,))], {"k": "v"},
                    msg.ErrorBody("NOT_FOUND", "gone"), False, False),
    msg.ModelCall("m", {"config": "{}", "file:1/model.py": b"code"}),
    msg.ModelReadyCall("m", None),
    msg.FamilyCall("requests", "how many", 0),
    msg.FamilyRegistered(1, "how many"),
    msg.SeriesCall("requests", {"model": "m"}, [1.0, 2.5]),
    msg.MetricUpdate("requests", {"model": "m"}, "add", 2.0),
    msg.SnapshotCall("requests", None),
    msg.LogRecordBody("tritium.x", 20, "INFO", "hello", "/m.py", "m.py", "m", 3, None, 1.5,
                      500.0, 2.0, 1, "MainThread", 9, None, None, None),
]


@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: type(p).__name__)
def test_every_call_payload_round_trips(payload: Any) -> None:
    crossed = decode(encode(msg.Call(1, "k", payload, msg.EMPTY, []))[4:]).payload
    assert isinstance(crossed, list), "it crosses as plain values"
    assert convert(type(payload), crossed) == payload


@pytest.mark.parametrize(("tp", "wire"), [
    (msg.BlsRequest, ["m"]),  # missing fields
    (msg.BlsRequest, {"model_name": "m"}),  # a map, not the message
    (msg.BlsRequest, [7, *REQUEST[1:]]),  # a model name that is not a str
    (msg.BlsRequest, [*REQUEST[:1], "1", *REQUEST[2:]]),  # a version that is a str
    (msg.BlsRequest, [*REQUEST, 1]),  # a field too many
    (msg.BlsRequest, [*REQUEST[:3], [["INPUT0", "FP32", ["4"]]], *REQUEST[4:]]),  # a shape
    (msg.BlsRequest, [*REQUEST[:3], [["INPUT0", "FP32"]], *REQUEST[4:]]),  # a short header
    (msg.BlsRequest, [*REQUEST[:3], [{"name": "x"}], *REQUEST[4:]]),  # a header as a map
    (msg.BlsRequest, [*REQUEST[:3], HEADER, *REQUEST[4:]]),  # inputs not an array
    (msg.BlsRequest, [*REQUEST[:4], "OUT", *REQUEST[5:]]),  # outputs not an array
    (msg.BlsRequest, [*REQUEST[:5], {"p": [1]}, *REQUEST[6:]]),  # a parameter not a scalar
    (msg.BlsRequest, [*REQUEST[:5], {1: 1}, *REQUEST[6:]]),  # a key not a str (undecodable)
    (msg.BlsRequest, [*REQUEST[:6], 1.5, *REQUEST[7:]]),  # a float correlation id
    (msg.BlsRequest, [*REQUEST[:9], "0"]),  # a trace slot that is a str
    (msg.BlsResponse, [*RESPONSE[:2], ["INTERNAL"], *RESPONSE[3:]]),  # an error's text
    (msg.BlsResponse, [*RESPONSE[:3], 1, False]),  # final not a bool
    (msg.BlsResponse, [[7], *RESPONSE[1:]]),  # a header that is no array
    (msg.ModelCall, ["m", [["config", "{}"]]]),  # parameters not a map
    (msg.ModelReadyCall, ["m", "1"]),
    (msg.FamilyCall, ["m", "d", "counter"]),
    (msg.SeriesCall, ["m", [["k", "v"]], []]),  # labels as pairs, not a map
    (msg.SeriesCall, ["m", {"k": 1}, []]),  # a label value not a str
    (msg.MetricUpdate, ["m", {}, "add", "1"]),
    (msg.SnapshotCall, ["m"]),
    (msg.LogRecordBody, ["tritium.x", "INFO"]),
], ids=str)
def test_a_malformed_call_payload_is_refused(tp: type, wire: Any) -> None:
    with pytest.raises(FrameError):
        convert(tp, unpack_value(pack_value(wire)))


def test_a_malformed_bls_call_is_answered_with_an_error() -> None:
    """The handler refuses what is not a BlsRequest before it reaches the server (the call
    answers that error; the channel and the instance stay up)."""
    ctx: Any = SimpleNamespace(instance=SimpleNamespace(service=None))
    for handler in (bls.serve_exec, bls.serve_stream):
        with pytest.raises(FrameError):
            asyncio.run(handler(ctx, ["m", None, "id"], []))


@pytest.mark.parametrize(("header", "size", "text"), [
    (msg.TensorHeader("X", "FP32", (1 << 40,)), 16, "arrived with 16 bytes"),
    (msg.TensorHeader("X", "FP32", (2, 3)), 16, "arrived with 16 bytes"),
    (msg.TensorHeader("X", "FP32", (-4, -1)), 16, "negative dimension"),
    (msg.TensorHeader("X", "FP99", (4,)), 16, "unknown datatype"),
    (msg.TensorHeader("X", "BYTES", (1 << 40,)), 16, "string elements"),
], ids=str)
def test_a_tensor_header_that_lies_about_its_buffer_is_refused(
        header: msg.TensorHeader, size: int, text: str) -> None:
    with pytest.raises(TritiumError, match=text):
        wire.decode_tensors([header], [memoryview(bytes(size))])


def test_the_auto_complete_answer_is_one_checked_message() -> None:
    config = model_config_pb2.ModelConfig(name="m")
    done = model_config_pb2.ModelConfig(name="m", max_batch_size=4)
    answer = pack_value(msg.CompletedConfig(done.SerializeToString(), None))
    assert autocomplete._answer(config, answer, 0) == done
    refused = pack_value(msg.CompletedConfig(None, msg.ErrorBody("UNAVAILABLE", "no")))
    with pytest.raises(TritiumError, match=r"^no$") as raised:
        autocomplete._answer(config, refused, 0)
    assert raised.value.code is ErrorCode.UNAVAILABLE
    for garbage in (b"OK\x01", pack_value(["ER", 1]), pack_value([None, ["INTERNAL"]])):
        with pytest.raises(TritiumError, match="answered what is no config") as raised:
            autocomplete._answer(config, garbage, 0)
        assert raised.value.code is ErrorCode.INVALID_ARG
    with pytest.raises(TritiumError, match="without answering"):
        autocomplete._answer(config, b"", 1)
