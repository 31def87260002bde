"""Sliced parsing of request messages: same result as FromString, and the loop keeps running."""

from __future__ import annotations

import asyncio
import struct
import time
from typing import Any

import pytest
from google.protobuf import empty_pb2
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from tritium.frontends.grpc.call import BadMessage
from tritium.frontends.grpc.parse import DEFAULT_BUDGET, SliceBudget, parse_message
from tritium.frontends.grpc.protowire import read_field

Request = pb.ModelInferRequest
MiB = 1 << 20

# Budgets small enough that every path (guessed cuts, read fields, packed pieces, sub-messages
# built in steps) runs on messages of a few hundred bytes.
TINY = [
    SliceBudget(inline_bytes=0, slice_bytes=8, hold_s=0, scan_fields=1, plan_fields=0),
    SliceBudget(inline_bytes=0, slice_bytes=24, hold_s=0, scan_fields=2, plan_fields=0),
    SliceBudget(inline_bytes=0, slice_bytes=64, hold_s=0, scan_fields=4, plan_fields=4),
    SliceBudget(inline_bytes=16, slice_bytes=200, hold_s=0, scan_fields=32),
]


def varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def field(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def parse(data: bytes | memoryview, budget: SliceBudget = DEFAULT_BUDGET,
          message_type: Any = Request) -> Any:
    return asyncio.run(parse_message(message_type, data, budget))


def assert_same(data: bytes, message_type: Any = Request) -> None:
    expected = message_type.FromString(data)
    for budget in TINY:
        got = parse(data, budget, message_type)
        assert got == expected
        assert got.SerializeToString(deterministic=True) == expected.SerializeToString(
            deterministic=True)


def sample_request() -> pb.ModelInferRequest:
    message = Request(model_name="m", model_version="1", id="req")
    message.parameters["sequence_id"].int64_param = 7
    message.parameters["note"].string_param = "x" * 40
    a = message.inputs.add(name="A", datatype="INT64", shape=[2, 3])
    a.contents.int64_contents.extend([-1, 0, 1, 1 << 40, -(1 << 62), 5])
    a.parameters["p"].bool_param = True
    b = message.inputs.add(name="B", datatype="BYTES", shape=[4])
    b.contents.bytes_contents.extend([b"", b"a", b"\x00" * 300, b"bc"])
    c = message.inputs.add(name="C", datatype="FP32", shape=[3])
    c.contents.fp32_contents.extend([1.5, -2.0, 3.25])
    c.contents.fp64_contents.extend([0.1] * 40)
    c.contents.uint_contents.extend(range(0, 2000, 7))
    c.contents.bool_contents.extend([True, False] * 30)
    message.outputs.add(name="OUT").parameters["classification"].int64_param = 3
    return message


def test_sliced_parse_equals_from_string_on_a_rich_request() -> None:
    assert_same(sample_request().SerializeToString())


def test_raw_input_contents_and_memoryview_input() -> None:
    message = Request(model_name="m")
    message.inputs.add(name="RAW", datatype="UINT8", shape=[5000])
    message.raw_input_contents.append(bytes(range(256)) * 20)
    message.raw_input_contents.append(b"")
    data = message.SerializeToString()
    assert_same(data)
    assert parse(memoryview(data), TINY[1]) == message


def test_unknown_fields_repeated_occurrences_and_unpacked_numbers() -> None:
    unknown = (varint(100 << 3) + varint(5) + varint(101 << 3 | 1) + bytes(8)
               + field(102, b"opaque") + varint(103 << 3 | 5) + bytes(4)
               + varint(104 << 3 | 3) + varint(1 << 3) + varint(9) + varint(104 << 3 | 4))
    unpacked = b"".join(varint(3 << 3) + varint(v) for v in (1, 300, (1 << 64) - 1))
    contents = unpacked + unknown + field(8, b"s") + unpacked
    tensor = field(1, b"T") + unknown + field(5, contents) + field(5, contents) + unknown
    data = (field(1, b"first") + unknown + field(5, tensor) + field(1, b"second")
            + field(4, field(1, b"k") + field(2, varint(1 << 3) + b"\x01")) + unknown
            + field(4, field(1, b"k") + field(2, field(4, b"later"))) + field(5, tensor))
    assert_same(data)
    assert parse(data, TINY[0]).inputs[0].contents.int64_contents[:3] == [1, 300, -1]


def test_map_entry_with_unknown_fields_goes_where_upb_puts_it() -> None:
    entry = field(1, b"k") + varint(9 << 3) + b"\x01" + field(2, varint(1 << 3) + b"\x01")
    assert_same(field(1, b"m") + field(4, entry) + field(4, field(1, b"k2")) * 3)


def test_packed_runs_split_at_element_boundaries() -> None:
    message = Request()
    contents = message.inputs.add(name="X").contents
    contents.int64_contents.extend([-1, 1 << 35, 127, 128, 0] * 50)
    contents.uint64_contents.extend([(1 << 64) - 1, 1] * 40)
    contents.fp64_contents.extend([1e300, -0.0] * 40)
    contents.int_contents.extend([-5, 1 << 30] * 40)
    assert_same(message.SerializeToString())


def test_nesting_limit_counts_from_the_top_as_upb_does() -> None:
    # The groups sit two sub-messages down, read field by field or inside a guessed slice.
    wide = SliceBudget(inline_bytes=0, slice_bytes=4096, hold_s=0, scan_fields=1, plan_fields=0)
    outcomes = []
    for depth in (97, 98, 99):
        groups = varint(9 << 3 | 3) * depth + varint(9 << 3 | 4) * depth
        contents = (field(8, b"a") * 300 + groups) * 20
        data = field(1, b"m") + field(5, field(1, b"T") + field(5, contents))
        try:
            expected = Request.FromString(data)
        except DecodeError:
            outcomes.append(False)
            for budget in [*TINY, wide]:
                with pytest.raises(BadMessage):
                    parse(data, budget)
        else:
            outcomes.append(True)
            for budget in [*TINY, wide]:
                assert parse(data, budget) == expected
    assert outcomes == [True, True, False]


@pytest.mark.parametrize("data", [
    field(1, b"m") + b"\x2a\x80",  # length cut short
    field(5, field(5, field(8, b"a") * 50 + b"\x42\x05ab")),  # truncated deep inside
    field(1, b"m") * 30 + b"\x00\x01",  # field number 0
    field(1, b"m") * 30 + b"\x0c",  # end-group with no group
    field(1, b"\xff\xfe") + field(2, b"v") * 30,  # a string that is not UTF-8
    field(5, field(5, field(3, b"\x80" * 12))),  # an over-long varint in a packed run
    field(5, field(5, field(6, b"\x00" * 7))),  # a packed float run of 7 bytes
    field(5, field(5, b"\x0b" + field(8, b"a") * 40 + b"\x14")),  # group closed by another
])
def test_malformed_bytes_raise_bad_message_like_from_string(data: bytes) -> None:
    with pytest.raises(DecodeError):
        Request.FromString(data)
    for budget in [*TINY, DEFAULT_BUDGET]:
        with pytest.raises(BadMessage) as caught:
            parse(data, budget)
        assert str(caught.value) == (
            "request message does not parse: "
            "Error parsing message with type 'inference.ModelInferRequest'")


def test_small_message_is_one_inline_from_string_without_yielding() -> None:
    coroutine = parse_message(Request, sample_request().SerializeToString())
    with pytest.raises(StopIteration) as done:
        coroutine.send(None)
    assert done.value.value == sample_request()


def test_other_message_types_parse_too() -> None:
    message = pb.RepositoryModelLoadRequest(model_name="m")
    message.parameters["config"].string_param = "{}" * 100
    message.parameters["file:1/model.py"].bytes_param = b"x" * 500
    assert_same(message.SerializeToString(), pb.RepositoryModelLoadRequest)


def test_too_many_entries_in_one_repeated_message_field_is_refused() -> None:
    data = field(1, b"m") + b"\x2a\x00" * 5000
    with pytest.raises(BadMessage, match="'inputs' holds more than 1000 entries"):
        parse(data, SliceBudget(inline_bytes=0, slice_bytes=1024, max_entries=1000))


def test_a_long_run_resumed_in_a_later_occurrence_of_its_message_is_refused() -> None:
    # Growing the first occurrence's array for the second would copy it in one step.
    first = field(5, b"\x42\x00" * ((1 << 21) + 1))
    data = field(5, field(1, b"T") + first + field(5, b"\x42\x00" * 100_000))
    with pytest.raises(BadMessage, match="'bytes_contents' continues in another occurrence"):
        parse(data)


def test_map_entry_past_the_budget_parses_whole_if_cheap_and_is_refused_if_not() -> None:
    cheap = field(4, field(1, b"k") + field(2, field(4, b"s" * 5000)))
    assert_same(field(1, b"m") + cheap)
    costly = field(4, field(1, b"k") + field(2, varint(1 << 3) + b"\x01") * 3000)
    budget = SliceBudget(inline_bytes=0, slice_bytes=1024, max_unsplit_fields=1000)
    with pytest.raises(BadMessage, match="too costly to parse"):
        parse(field(1, b"m") + costly, budget)


# -- generated messages ------------------------------------------------------------------

names = st.text(max_size=6)
scalars = st.one_of(
    st.builds(lambda v: pb.InferParameter(bool_param=v), st.booleans()),
    st.builds(lambda v: pb.InferParameter(int64_param=v), st.integers(-(2**63), 2**63 - 1)),
    st.builds(lambda v: pb.InferParameter(string_param=v), names),
    st.builds(lambda v: pb.InferParameter(double_param=v), st.floats(allow_nan=False)),
    st.builds(lambda v: pb.InferParameter(uint64_param=v), st.integers(0, 2**64 - 1)),
)
parameters = st.dictionaries(names, scalars, max_size=3)
int32s = st.lists(st.integers(-(2**31), 2**31 - 1), max_size=40)
uint64s = st.lists(st.integers(0, 2**64 - 1), max_size=20)
floats32 = st.lists(st.floats(width=32, allow_nan=False), max_size=20)
contents = st.builds(
    lambda b, i, i64, u64, f32, by: pb.InferTensorContents(
        bool_contents=b, int_contents=i, int64_contents=i64, uint64_contents=u64,
        fp32_contents=f32, bytes_contents=by),
    st.lists(st.booleans(), max_size=30), int32s,
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=20), uint64s, floats32,
    st.lists(st.binary(max_size=5), max_size=40))


@st.composite
def requests(draw: st.DrawFn) -> pb.ModelInferRequest:
    message = Request(model_name=draw(names), model_version=draw(names), id=draw(names))
    for key, value in draw(parameters).items():
        message.parameters[key].CopyFrom(value)
    for _ in range(draw(st.integers(0, 3))):
        tensor = message.inputs.add(name=draw(names), datatype="INT32",
                                    shape=draw(st.lists(st.integers(0, 9), max_size=3)))
        if draw(st.booleans()):
            tensor.contents.CopyFrom(draw(contents))
        for key, value in draw(parameters).items():
            tensor.parameters[key].CopyFrom(value)
    for name in draw(st.lists(names, max_size=2)):
        message.outputs.add(name=name)
    message.raw_input_contents.extend(draw(st.lists(st.binary(max_size=50), max_size=2)))
    return message


unknown_fields = st.lists(st.one_of(
    st.builds(lambda n, v: varint(n << 3) + varint(v), st.integers(20, 3000),
              st.integers(0, 2**64 - 1)),
    st.builds(lambda n, v: field(n, v), st.integers(20, 3000), st.binary(max_size=20)),
    st.builds(lambda n, v: varint(n << 3 | 5) + struct.pack("<f", v), st.integers(20, 99),
              st.floats(width=32)),
), max_size=4).map(b"".join)

fast = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@fast
@given(st.lists(st.tuples(requests(), unknown_fields), min_size=1, max_size=3))
def test_generated_requests_match_from_string(parts: list[tuple[Any, bytes]]) -> None:
    # Concatenated messages merge: singular fields repeat, sub-messages continue.
    assert_same(b"".join(message.SerializeToString() + extra for message, extra in parts))


@fast
@given(requests(), st.data())
def test_mutated_bytes_parse_or_fail_exactly_as_from_string(message: Any, data: Any) -> None:
    wire = bytearray(message.SerializeToString() + field(5, field(5, field(8, b"tail") * 8)))
    for _ in range(data.draw(st.integers(1, 3))):
        index = data.draw(st.integers(0, len(wire) - 1))
        wire[index] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(wire)))
    blob = bytes(wire[:cut])
    try:
        expected = Request.FromString(blob)
    except DecodeError:
        for budget in TINY:
            with pytest.raises(BadMessage):
                parse(blob, budget)
    else:
        for budget in TINY:
            assert parse(blob, budget) == expected


def frames(data: bytes) -> bool:
    """Whether ``read_field`` reads ``data`` to its end as whole fields."""
    view, pos = memoryview(data), 0
    try:
        while pos < len(data):
            pos = read_field(view, pos, len(data), 0, 1 << 20)[3]
    except DecodeError:
        return False
    return True


@fast
@given(st.one_of(st.binary(max_size=40), unknown_fields,
                 requests().map(lambda m: m.SerializeToString())), st.data())
def test_fields_are_framed_exactly_as_upb_frames_them(wire: bytes, data: Any) -> None:
    blob = bytearray(wire)
    for _ in range(data.draw(st.integers(0, 2))):
        if blob:
            blob[data.draw(st.integers(0, len(blob) - 1))] = data.draw(st.integers(0, 255))
    try:
        empty_pb2.Empty.FromString(bytes(blob))
    except DecodeError:
        assert not frames(bytes(blob))
    else:
        assert frames(bytes(blob))


# -- the loop keeps running --------------------------------------------------------------

async def parse_watching_the_loop(data: bytes) -> tuple[float, list[Any]]:
    """Parse while a probe task records the longest CPU time the loop spent away from it.

    Thread CPU time, not wall time: other processes on a loaded machine stretch wall gaps,
    but only our own work between yields holds the loop. The message stays inside: a huge
    result of ``asyncio.run`` gets repr'd on the way out (CPython 3.11's SIGINT handling)."""
    longest = 0.0
    stop = False

    async def probe() -> None:
        nonlocal longest
        last = time.thread_time()
        while not stop:
            await asyncio.sleep(0)
            now = time.thread_time()
            longest = max(longest, now - last)
            last = now

    task = asyncio.create_task(probe())
    await asyncio.sleep(0)
    try:
        message = await parse_message(Request, data)
    finally:
        stop = True
        await task
    tensor = message.inputs[0]
    return longest, [message.model_name, list(tensor.shape), len(tensor.contents.bytes_contents)]


@pytest.mark.timeout(30)
def test_hostile_64_mib_of_empty_bytes_elements_never_holds_the_loop_long() -> None:
    count = (64 * MiB - 64) // 2
    tensor = (field(1, b"INPUT0") + field(2, b"BYTES") + field(3, varint(count))
              + field(5, b"\x42\x00" * count))
    longest, seen = asyncio.run(parse_watching_the_loop(field(1, b"m") + field(5, tensor)))
    assert longest < 0.05
    assert seen == ["m", [count], count]


def test_big_raw_inputs_are_lifted_as_views_in_their_places() -> None:
    """Raw entries past ``lift_bytes`` are never copied by upb: the message reads as
    FromString's, with those entries read-only views of the wire bytes."""
    message = Request(model_name="m", id="lifted")
    for name in "ABCD":
        message.inputs.add(name=name, datatype="UINT8", shape=[1])
    entries = [b"s" * 10, bytes(range(256)) * 8192, b"", bytes(3 * MiB)]
    message.raw_input_contents.extend(entries)
    data = message.SerializeToString()
    got = parse(data)
    assert got.model_name == "m" and got.id == "lifted"
    assert [item.name for item in got.inputs] == list("ABCD")
    raw = got.raw_input_contents
    assert len(raw) == 4 and list(raw) == entries and raw[-1] == entries[-1]
    assert raw[1:3] == entries[1:3]
    for index in (1, 3):
        assert isinstance(raw[index], memoryview) and raw[index].readonly
        assert raw[index].obj is data  # a view of the wire bytes: nothing copied
    assert type(raw[0]) is bytes
    with pytest.raises(IndexError):
        raw[4]


def test_small_raw_inputs_and_nested_bytes_are_not_lifted() -> None:
    message = Request(model_name="m")
    message.inputs.add(name="B", datatype="BYTES", shape=[1]).contents.bytes_contents.append(
        bytes(2 * MiB))
    message.raw_input_contents.append(bytes(512 * 1024))
    data = message.SerializeToString()
    assert parse(data) == message


@pytest.mark.parametrize("where", ["nested bytes", "unknown field", "string", "parameter"])
def test_a_field_past_the_copy_bound_is_refused(where: str) -> None:
    """Any other field upb would copy in one step is at most ``max_copy_bytes``."""
    big = bytes(3 * MiB)
    message = Request(model_name="m")
    if where == "nested bytes":
        message.inputs.add(name="B").contents.bytes_contents.append(big)
        data = message.SerializeToString()
    elif where == "unknown field":
        data = message.SerializeToString() + field(99, big)
    elif where == "parameter":
        message.parameters["p"].string_param = big.decode()
        data = message.SerializeToString()
    else:
        data = message.SerializeToString() + field(3, big)  # id
    bounded = SliceBudget(max_copy_bytes=2 * MiB)
    with pytest.raises(BadMessage, match="more than one step may copy"):
        parse(data, bounded)
    assert parse(data).ByteSize() == Request.FromString(data).ByteSize()  # default: 32 MiB


LIFTING = SliceBudget(inline_bytes=0, slice_bytes=24, hold_s=0, scan_fields=2, plan_fields=0,
                      lift_bytes=32)


@fast
@given(st.lists(st.tuples(requests(), unknown_fields,
                          st.lists(st.binary(max_size=80), max_size=4)), min_size=1, max_size=3))
def test_lifted_entries_read_as_from_string_in_any_message(
        parts: list[tuple[Any, bytes, list[bytes]]]) -> None:
    """Whatever surrounds them, entries of at least ``lift_bytes`` are lifted (views) and
    the rest parsed, and the message reads as FromString's."""
    wire = b"".join(message.SerializeToString() + extra + b"".join(field(7, e) for e in raw)
                    for message, extra, raw in parts)
    expected = Request.FromString(wire)
    got = parse(wire, LIFTING)
    raw = got.raw_input_contents
    assert list(raw) == list(expected.raw_input_contents)
    for entry in raw:
        assert isinstance(entry, memoryview) == (len(entry) >= LIFTING.lift_bytes)
    for name in ("model_name", "model_version", "id", "parameters", "inputs", "outputs"):
        assert getattr(got, name) == getattr(expected, name)
