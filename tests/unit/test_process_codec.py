"""The one codec of the instance channel: every message round-trips by name, and what is
not exactly a message is refused (FrameError), never built or run."""

from __future__ import annotations

import pickle
from typing import Any

import msgpack
import pytest

from tritium.core.errors import ErrorCode, TritiumError
from tritium.execution.backend import InstanceInfo
from tritium.execution.process import messages as msg
from tritium.execution.process.codec import FrameError, FrameReader, convert, decode, encode

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
    msg.Call(9, "bls.exec", None, msg.Packed(-1, [], b"inline"), [3]),
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
        decode(msgpack.packb(wire))


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
