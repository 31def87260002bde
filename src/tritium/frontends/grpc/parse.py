"""Request messages parsed without holding the event loop: big ones merge in bounded slices."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from google.protobuf import empty_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

from tritium.frontends.grpc.call import BadMessage

M = TypeVar("M", bound=Message)

# upb refuses a message nested deeper than this many sub-messages and groups.
_MAX_NESTING = 100
# Bytes of fields read one by one in Python between looks at the clock (4k tiny ones, ~2 ms).
_SCAN_PACE_BYTES = 8192


@dataclass(frozen=True, slots=True)
class SliceBudget:
    """How much parsing one step on the event loop may do.

    Costs count bytes of the densest wire data (tiny sub-messages, ~30 ns a byte in upb);
    payloads upb only copies (strings, bytes, unknown fields, packed fixed-width numbers)
    count a 32nd of their length, packed varints an 8th."""

    inline_bytes: int = 128 * 1024  # messages this small are one FromString, as before
    slice_bytes: int = 128 * 1024  # what one merge step may cost
    hold_s: float = 0.002  # once parsing has run this long, let the loop run
    scan_fields: int = 32  # fields read one at a time before guessing a cut further on
    plan_fields: int = 1024  # a message of fewer, cheap fields parses whole (one copy)
    max_entries: int = 65536  # sub-messages or map entries in one repeated field or map
    max_unsplit_fields: int = 4096  # fields a map entry or group past slice_bytes may hold


DEFAULT_BUDGET = SliceBudget()


async def parse_message(
    message_type: type[M], data: bytes | memoryview, budget: SliceBudget = DEFAULT_BUDGET
) -> M:
    """``message_type.FromString(data)``, yielding to the loop while a big message parses.

    Raises ``BadMessage`` (INVALID_ARGUMENT) for bytes that do not parse, and for shapes
    whose parse cannot be bounded (more than ``max_entries`` sub-messages in one field, a
    huge map entry or group of tiny fields)."""
    if len(data) <= budget.inline_bytes:
        try:
            return message_type.FromString(data)
        except DecodeError as exc:
            raise BadMessage(f"request message does not parse: {exc}") from None
    view = memoryview(data).cast("B")
    try:
        if _cheap_whole(view, _layout(message_type.DESCRIPTOR), budget):
            return message_type.FromString(data)
        message = message_type()
        await _Slicer(view, budget).merge(message, 0, len(view), 0)
    except (DecodeError, _Malformed):
        name = message_type.DESCRIPTOR.full_name
        raise BadMessage(
            f"request message does not parse: Error parsing message with type '{name}'"
        ) from None
    except _Unsplittable as exc:
        raise BadMessage(f"request message is too costly to parse: {exc}") from None
    return message


class _Malformed(Exception):
    """The wire data is not a protobuf message (upb would refuse it too)."""


class _Unsplittable(Exception):
    """A part that must parse in one step would hold the loop too long."""


# What a length-delimited field holds, which decides how it may be split.
_MESSAGE, _REPEATED, _MAP, _VARINTS, _FIXED32S, _FIXED64S, _OPAQUE = range(7)
_MESSAGES = (_MESSAGE, _REPEATED, _MAP)
_PACKED = (_VARINTS, _FIXED32S, _FIXED64S)
# How many bytes of payload count as one byte of dense wire data, as a shift.
_PAYLOAD_SHIFT = {_MESSAGE: 0, _REPEATED: 0, _MAP: 0, _VARINTS: 3, _FIXED32S: 5,
                  _FIXED64S: 5, _OPAQUE: 5}
_TYPES = FieldDescriptor
_FIXED32_TYPES = {_TYPES.TYPE_FIXED32, _TYPES.TYPE_SFIXED32, _TYPES.TYPE_FLOAT}
_FIXED64_TYPES = {_TYPES.TYPE_FIXED64, _TYPES.TYPE_SFIXED64, _TYPES.TYPE_DOUBLE}
_OPAQUE_TYPES = {_TYPES.TYPE_STRING, _TYPES.TYPE_BYTES, _TYPES.TYPE_GROUP}


@dataclass(frozen=True, slots=True)
class _Field:
    kind: int
    name: str
    message: Descriptor | None  # the sub-message type, for the message kinds


@dataclass(frozen=True, slots=True)
class _Layout:
    fields: dict[int, _Field]  # by number
    entries: tuple[str, ...]  # repeated message fields and maps: their length is bounded
    arrays: tuple[tuple[str, int], ...]  # repeated scalars, with their least bytes per element


_LAYOUTS: dict[Descriptor, _Layout] = {}


def _layout(descriptor: Descriptor) -> _Layout:
    layout = _LAYOUTS.get(descriptor)
    if layout is None:
        fields = {fd.number: _Field(_kind(fd), fd.name, fd.message_type)
                  for fd in descriptor.fields}
        repeated = [fd for fd in descriptor.fields if fd.label == _TYPES.LABEL_REPEATED]
        layout = _LAYOUTS[descriptor] = _Layout(
            fields,
            tuple(fd.name for fd in repeated if fd.type == _TYPES.TYPE_MESSAGE),
            tuple((fd.name, _least_element_bytes(fd)) for fd in repeated
                  if fd.type != _TYPES.TYPE_MESSAGE),
        )
    return layout


def _kind(fd: FieldDescriptor) -> int:
    repeated = fd.label == _TYPES.LABEL_REPEATED
    if fd.type == _TYPES.TYPE_MESSAGE:
        if fd.message_type.GetOptions().map_entry:
            return _MAP
        return _REPEATED if repeated else _MESSAGE
    if fd.type in _OPAQUE_TYPES or not repeated:
        # A singular scalar arriving length-delimited is an unknown field to upb.
        return _OPAQUE
    if fd.type in _FIXED32_TYPES:
        return _FIXED32S
    return _FIXED64S if fd.type in _FIXED64_TYPES else _VARINTS


def _least_element_bytes(fd: FieldDescriptor) -> int:
    if fd.type in _OPAQUE_TYPES:
        return 2  # a tag and an empty length
    return 4 if fd.type in _FIXED32_TYPES else 8 if fd.type in _FIXED64_TYPES else 1


class _Room:
    """An empty iterable claiming ``size`` items: ``extend`` makes room without adding any.

    upb's repeated-scalar ``extend`` reserves ``len()`` more slots before iterating; with
    room made once, merging a long run in slices never copies the array to grow it."""

    __slots__ = ("size",)

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[Any]:
        return iter(())


@dataclass(slots=True)
class _Target:
    """A message being merged from ``[.., end)`` of the wire, with its growth watched."""

    message: Any
    layout: _Layout
    end: int
    unreserved: list[tuple[str, int]]


def _cheap_whole(view: memoryview, layout: _Layout, budget: SliceBudget) -> bool:
    """Whether the message is a few fields, costly only in bytes upb copies (big raw inputs).

    Parsed whole, such a message is copied once; in slices, its big fields would be twice."""
    pos, cost, end = 0, 0, len(view)
    for _ in range(budget.plan_fields):
        if pos == end:
            return True
        number, wire, body, field_end = _read_field(view, pos, end, 0, budget)
        field = layout.fields.get(number) if wire == 2 else None
        kind = field.kind if field is not None else _OPAQUE
        cost += field_end - pos if wire != 2 or kind in _MESSAGES else body - pos
        if cost > budget.slice_bytes:
            return False
        pos = field_end
    return pos == end


class _Slicer:
    """Merges one message's wire bytes into a message object, a bounded step at a time."""

    def __init__(self, view: memoryview, budget: SliceBudget):
        self.view = view
        self.budget = budget
        self.mark = time.perf_counter()

    async def pace(self) -> None:
        if time.perf_counter() - self.mark >= self.budget.hold_s:
            await asyncio.sleep(0)
            self.mark = time.perf_counter()

    def apply(self, target: _Target, start: int, end: int) -> None:
        if start < end:
            target.message.MergeFromString(self.view[start:end])
            self.check(target, end)

    def check(self, target: _Target, pos: int) -> None:
        """Bound what the merges so far have grown, and make room for what may follow."""
        message, most = target.message, self.budget.max_entries
        for name in target.layout.entries:
            if len(getattr(message, name)) > most:
                raise _Unsplittable(f"'{name}' holds more than {most} entries")
        left = target.end - pos
        if not target.unreserved or left <= self.budget.slice_bytes:
            return
        for item in list(target.unreserved):
            array = getattr(message, item[0])
            if len(array) >= 4096:  # many small elements: room for as many as could follow
                if len(array) > 1 << 21:
                    # Making room would copy what is there: a message sent in pieces.
                    raise _Unsplittable(f"'{item[0]}' continues in another occurrence")
                array.extend(_Room(left // item[1]))
                target.unreserved.remove(item)

    async def merge(self, message: Any, start: int, end: int, depth: int) -> None:
        """Merge the fields in ``view[start:end]`` into ``message``, ``depth`` levels down.

        Invariant: ``start`` and ``pos`` are field boundaries, and ``view[start:pos]`` waits
        to be merged, costing ``cost``; it is merged before it would pass the budget."""
        layout = _layout(message.DESCRIPTOR)
        target = _Target(message, layout, end, list(layout.arrays))
        budget = self.budget.slice_bytes
        pos, cost, scanned, may_guess, paced = start, 0, 0, True, start
        while cost + (end - pos) > budget:
            if may_guess and scanned >= self.budget.scan_fields:
                may_guess = False
                cut = self.guess_cut(start, end, depth)
                if cut is not None:
                    self.apply(target, start, cut)
                    await self.pace()
                    start = pos = cut
                    cost, scanned, may_guess = 0, 0, True
                    continue
            number, wire, body, field_end = _read_field(self.view, pos, end, depth, self.budget)
            field = layout.fields.get(number)
            weight = _weight(field, wire, pos, body, field_end)
            if weight > budget:
                self.apply(target, start, pos)
                await self.pace()
                await self.merge_big(target, field, number, wire, (pos, body, field_end), depth)
                start, cost, scanned, may_guess = field_end, 0, 0, True
            elif cost + weight > budget:
                self.apply(target, start, pos)
                await self.pace()
                start, cost, scanned, may_guess = pos, weight, 0, True
            else:
                cost += weight
            pos = field_end
            scanned += 1
            if pos - paced >= _SCAN_PACE_BYTES:
                paced = pos
                await self.pace()
        self.apply(target, start, end)
        await self.pace()

    async def merge_big(self, target: _Target, field: _Field | None, number: int, wire: int,
                        span: tuple[int, int, int], depth: int) -> None:
        """One field costing more than a step: split it by its kind, or parse it whole."""
        pos, body, end = span
        kind = field.kind if field is not None and wire == 2 else _OPAQUE
        if field is not None and kind in (_MESSAGE, _REPEATED):
            if depth >= _MAX_NESTING:
                raise _Malformed
            holder = getattr(target.message, field.name)
            if kind == _REPEATED:
                sub = holder.add()
                self.check(target, end)
            else:
                sub = holder
                sub.SetInParent()
            await self.merge(sub, body, end, depth + 1)
        elif kind in _PACKED:
            await self.merge_packed(target, number, kind, body, end)
        else:
            if field is not None and field.message is not None and kind == _MAP:
                # A map entry goes to upb whole: it must be cheap to parse.
                _check_unsplit(self.view, (body, end), field.message, depth + 1, self.budget)
            self.apply(target, pos, end)
            await self.pace()

    async def merge_packed(self, target: _Target, number: int, kind: int, body: int,
                           end: int) -> None:
        """A packed run is the concatenation of its elements: send it as several runs."""
        tag = _encode_varint(number << 3 | 2)
        piece = self.budget.slice_bytes << _PAYLOAD_SHIFT[kind]
        if kind != _VARINTS:
            width = 4 if kind == _FIXED32S else 8
            piece = max(width, piece - piece % width)
        pos = body
        while pos < end:
            cut = min(pos + piece, end)
            if kind == _VARINTS and cut < end:
                cut = _varint_boundary(self.view, cut, end)
            target.message.MergeFromString(
                b"".join((tag, _encode_varint(cut - pos), self.view[pos:cut])))
            self.check(target, cut)
            pos = cut
            await self.pace()

    def guess_cut(self, start: int, end: int, depth: int) -> int | None:
        """A field boundary about a slice past ``start``, found without reading every field.

        Guesses decode a few plausible fields from a random point; one is kept only if upb
        frames ``view[start:cut]`` as whole fields, which, ``start`` being a boundary, holds
        exactly when ``cut`` is one too. Randomness keeps a crafted message from placing
        decoys at every guess; a few misses, and the fields are read one by one."""
        budget = self.budget.slice_bytes
        span = max(1, min(64, budget // 8))
        limit = min(end, start + budget)
        low = start + budget // 2
        target = random.randint(low, max(low, limit - 4 * span))
        for cut in itertools.islice(_plausible_cuts(self.view, target, span, limit), 3):
            probe = self.view[start:cut]
            try:
                if depth:
                    # As deep as the real merge sits, so that upb counts nesting as it will.
                    empty_pb2.Empty.FromString(b"".join((b"\x0b" * depth, probe,
                                                          b"\x0c" * depth)))
                else:
                    empty_pb2.Empty.FromString(probe)
            except DecodeError:
                continue
            return cut
        return None


def _weight(field: _Field | None, wire: int, pos: int, body: int, end: int) -> int:
    if wire != 2:
        return end - pos
    kind = field.kind if field is not None else _OPAQUE
    return body - pos + ((end - body) >> _PAYLOAD_SHIFT[kind])


def _plausible_cuts(view: memoryview, target: int, span: int, limit: int) -> Iterator[int]:
    """Ends of four fields decoding cleanly from points in ``[target, +span)``."""
    seen = set()
    for first in range(target, min(target + span, limit)):
        pos: int | None = first
        for _ in range(4):
            assert pos is not None
            pos = _plausible_end(view, pos, limit)
            if pos is None:
                break
        if pos is not None and pos not in seen:
            seen.add(pos)
            yield pos


def _plausible_end(view: memoryview, pos: int, limit: int) -> int | None:
    try:
        wire, pos = _read_tag(view, pos, limit)[1:]
        return None if wire == 3 else _skip_value(view, wire, pos, limit)[1]
    except _Malformed:
        return None


def _read_varint(view: memoryview, pos: int, end: int, most: int) -> tuple[int, int]:
    value = shift = 0
    for index in range(pos, min(pos + most, end)):
        byte = view[index]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, index + 1
        shift += 7
    raise _Malformed


def _read_tag(view: memoryview, pos: int, end: int) -> tuple[int, int, int]:
    tag, pos = _read_varint(view, pos, end, 5)
    if tag < 8 or tag > 0xFFFFFFFF:
        raise _Malformed
    return tag >> 3, tag & 7, pos


def _read_field(view: memoryview, pos: int, end: int, depth: int,
                budget: SliceBudget) -> tuple[int, int, int, int]:
    """(number, wire type, payload start, end) of the field at ``pos``, framed as upb does."""
    number, wire, body = _read_tag(view, pos, end)
    if wire == 3:
        field_end = _group_end(view, body, end, number, _MAX_NESTING - depth, budget)
    else:
        body, field_end = _skip_value(view, wire, body, end)
    return number, wire, body, field_end


def _skip_value(view: memoryview, wire: int, pos: int, end: int) -> tuple[int, int]:
    """(payload start, end) of a field's value that is not a group."""
    if wire == 0:
        field_end = _read_varint(view, pos, end, 10)[1]
    elif wire == 2:
        size, pos = _read_varint(view, pos, end, 10)
        if size >= 0x7FFFFFFF:
            raise _Malformed
        field_end = pos + size
    elif wire in (1, 5):
        field_end = pos + (8 if wire == 1 else 4)
    else:
        raise _Malformed  # an end-group outside its group, or wire type 6 or 7
    if field_end > end:
        raise _Malformed
    return pos, field_end


def _group_end(view: memoryview, pos: int, end: int, number: int, room: int,
               budget: SliceBudget) -> int:
    """Where the group opened with ``number`` closes; it must hold few fields."""
    opened = [number]
    for _ in range(budget.max_unsplit_fields):
        if len(opened) > room:
            raise _Malformed  # deeper than upb's nesting limit
        inner, wire, pos = _read_tag(view, pos, end)
        if wire == 4:
            if inner != opened.pop():
                raise _Malformed
            if not opened:
                return pos
        elif wire == 3:
            opened.append(inner)
        else:
            pos = _skip_value(view, wire, pos, end)[1]
    raise _Unsplittable(f"a group holds more than {budget.max_unsplit_fields} fields")


def _check_unsplit(view: memoryview, span: tuple[int, int], descriptor: Descriptor,
                   depth: int, budget: SliceBudget) -> None:
    """Refuse a part that must parse whole if upb would read too many fields in it.

    Only parsed fields count: upb copies strings, bytes and unknown fields without reading
    inside them."""
    fields, pending = 0, [(span[0], span[1], _layout(descriptor), depth)]
    while pending:
        pos, stop, layout, level = pending.pop()
        while pos < stop:
            number, wire, body, field_end = _read_field(view, pos, stop, level, budget)
            field = layout.fields.get(number) if wire == 2 else None
            if field is not None and field.message is not None and field.kind in _MESSAGES:
                pending.append((body, field_end, _layout(field.message), level + 1))
            elif field is not None and field.kind == _VARINTS:
                fields += (field_end - body) >> 4  # a packed varint costs a 16th of a field
            elif wire == 3:
                fields += (field_end - body) >> 1  # as many fields as its bytes allow
            fields += 1
            if fields > budget.max_unsplit_fields:
                raise _Unsplittable(
                    f"a part of {span[1] - span[0]} bytes that parses in one step holds more "
                    f"than {budget.max_unsplit_fields} fields"
                )
            pos = field_end


def _varint_boundary(view: memoryview, pos: int, end: int) -> int:
    """The first element boundary at or after ``pos`` in a packed varint run."""
    for index in range(pos - 1, min(pos + 9, end)):
        if view[index] < 0x80:
            return index + 1
    raise _Malformed


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
