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
from tritium.frontends.grpc.lifted import Lifted, LiftedEntries
from tritium.frontends.grpc.protowire import (
    MAX_NESTING,
    GroupTooLarge,
    encode_varint,
    plausible_cuts,
    read_field,
    varint_boundary,
)

M = TypeVar("M", bound=Message)

# Bytes of fields read one by one in Python between looks at the clock (4k tiny ones, ~2 ms).
_SCAN_PACE_BYTES = 8192


@dataclass(frozen=True, slots=True)
class SliceBudget:
    """How much parsing one step on the event loop may do.

    Costs count bytes of the densest wire data (tiny sub-messages, up to ~55 ns a byte);
    payloads upb only copies (strings, bytes, unknown fields, packed fixed-width numbers)
    count a 32nd of their length, packed varints a 4th."""

    inline_bytes: int = 64 * 1024  # messages this small are one FromString, as before
    slice_bytes: int = 64 * 1024  # what one merge step may cost (<= ~4 ms in upb)
    hold_s: float = 0.002  # once parsing has run this long, let the loop run
    scan_fields: int = 32  # fields read one at a time before guessing a cut further on
    plan_fields: int = 1024  # a message of fewer, cheap fields parses whole (one copy)
    max_entries: int = 65536  # sub-messages or map entries in one repeated field or map
    max_unsplit_fields: int = 4096  # fields a map entry or group past slice_bytes may hold
    # Entries of a top-level repeated bytes field this large are lifted, not copied (see
    # ``lifted``); any other string, bytes or unknown field upb would copy in one step may
    # be at most ``max_copy_bytes`` (~20 ms of copying with the GIL held).
    lift_bytes: int = 1 << 20
    max_copy_bytes: int = 32 << 20


DEFAULT_BUDGET = SliceBudget()


async def parse_message(
    message_type: type[M], data: bytes | memoryview, budget: SliceBudget = DEFAULT_BUDGET
) -> M | Lifted:
    """``message_type.FromString(data)``, yielding to the loop while a big message parses;
    a ``Lifted`` over it when entries of its repeated bytes field were lifted (see there).

    ``data`` must not change while the result is in use (lifted entries are views of it).
    Raises ``BadMessage`` (INVALID_ARGUMENT) for bytes that do not parse, and for shapes
    whose parse cannot be bounded (more than ``max_entries`` sub-messages in one field, a
    huge map entry or group of tiny fields)."""
    if len(data) <= budget.inline_bytes:
        try:
            return message_type.FromString(data)
        except DecodeError as exc:
            raise BadMessage(f"request message does not parse: {exc}") from None
    view = memoryview(data).cast("B").toreadonly()
    layout = _layout(message_type.DESCRIPTOR)
    try:
        if _cheap_whole(view, layout, budget):
            return message_type.FromString(data)
        message = message_type()
        slicer = _Slicer(view, budget)
        await slicer.merge(message, 0, len(view), 0)
    except DecodeError:
        name = message_type.DESCRIPTOR.full_name
        raise BadMessage(
            f"request message does not parse: Error parsing message with type '{name}'"
        ) from None
    except (_Unsplittable, GroupTooLarge) as exc:
        raise BadMessage(f"request message is too costly to parse: {exc}") from None
    if slicer.lifted:
        assert layout.lifts is not None
        name = layout.fields[layout.lifts].name
        return Lifted(message, name, LiftedEntries(getattr(message, name), slicer.lifted))
    return message


class _Unsplittable(Exception):
    """Parsing would take a step holding the loop too long, or grow without bound."""


# What a length-delimited field holds, which decides how it may be split.
_MESSAGE, _REPEATED, _MAP, _VARINTS, _FIXED32S, _FIXED64S, _OPAQUE = range(7)
_MESSAGES = (_MESSAGE, _REPEATED, _MAP)
_PACKED = (_VARINTS, _FIXED32S, _FIXED64S)
# How many bytes of payload count as one byte of dense wire data, as a shift.
_PAYLOAD_SHIFT = {_MESSAGE: 0, _REPEATED: 0, _MAP: 0, _VARINTS: 2, _FIXED32S: 5,
                  _FIXED64S: 5, _OPAQUE: 5}
_TYPES = FieldDescriptor
_FIXED32_TYPES = {_TYPES.TYPE_FIXED32, _TYPES.TYPE_SFIXED32, _TYPES.TYPE_FLOAT}
_FIXED64_TYPES = {_TYPES.TYPE_FIXED64, _TYPES.TYPE_SFIXED64, _TYPES.TYPE_DOUBLE}
_OPAQUE_TYPES = {_TYPES.TYPE_STRING, _TYPES.TYPE_BYTES, _TYPES.TYPE_GROUP}


@dataclass(frozen=True, slots=True)
class _Field:
    """How a field's length-delimited occurrences are merged."""
    kind: int
    name: str
    message: Descriptor | None  # the sub-message type, for the message kinds


@dataclass(frozen=True, slots=True)
class _Layout:
    """A message type's fields, as slicing needs them."""
    fields: dict[int, _Field]  # by number
    entries: tuple[str, ...]  # repeated message fields and maps: their length is bounded
    arrays: tuple[tuple[str, int], ...]  # repeated scalars, with their least bytes per element
    lifts: int | None  # the number of a repeated bytes field whose big entries are lifted


_LAYOUTS: dict[Descriptor, _Layout] = {}


def _layout(descriptor: Descriptor) -> _Layout:
    layout = _LAYOUTS.get(descriptor)
    if layout is None:
        repeated = [fd for fd in descriptor.fields if fd.label == _TYPES.LABEL_REPEATED]
        layout = _LAYOUTS[descriptor] = _Layout(
            {fd.number: _Field(_kind(fd), fd.name, fd.message_type) for fd in descriptor.fields},
            tuple(fd.name for fd in repeated if fd.type == _TYPES.TYPE_MESSAGE),
            tuple((fd.name, _least_element_bytes(fd)) for fd in repeated
                  if fd.type != _TYPES.TYPE_MESSAGE),
            next((fd.number for fd in repeated if fd.type == _TYPES.TYPE_BYTES), None))
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
    # A string is at least a tag and a length; a number, one byte of a packed run.
    return 2 if fd.type in _OPAQUE_TYPES else 4 if fd.type in _FIXED32_TYPES else (
        8 if fd.type in _FIXED64_TYPES else 1)


class _Room:
    """An empty iterable claiming ``size`` items: ``extend`` makes room without adding any.

    upb's repeated-scalar ``extend`` reserves ``len()`` more slots before iterating; with
    room made once, merging a long run in slices never copies the array to grow it."""

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
    """Whether the message is a few fields, costly only for one big payload upb copies.

    Parsed whole, a big raw input is copied once; merged alone, twice (upb copies a view
    into bytes first). Whole wins when that payload is at least half the message."""
    pos, cost, largest, end = 0, 0, 0, len(view)
    for _ in range(budget.plan_fields):
        if pos == end:
            break
        number, wire, body, field_end = read_field(view, pos, end, 0, budget.max_unsplit_fields)
        field = layout.fields.get(number) if wire == 2 else None
        kind = field.kind if field is not None else _OPAQUE
        if wire != 2:
            cost += field_end - pos
        elif kind in (_OPAQUE, _FIXED32S, _FIXED64S):  # copied, not read
            cost += body - pos
            size = field_end - body
            if size > budget.max_copy_bytes or (
                    size >= budget.lift_bytes and number == layout.lifts):
                return False  # refused, or lifted: never copied whole
            largest = max(largest, size)
        else:
            cost += body - pos + ((field_end - body) >> _PAYLOAD_SHIFT[kind])
        if cost > budget.slice_bytes:
            return False
        pos = field_end
    return pos == end and 2 * largest >= end


class _Slicer:
    """Merges one message's wire bytes into a message object, a bounded step at a time."""

    def __init__(self, view: memoryview, budget: SliceBudget):
        self.view, self.budget, self.mark = view, budget, time.perf_counter()
        # Entries of the top level's lifted field taken as views: (index in it, view).
        self.lifted: list[tuple[int, memoryview]] = []

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
                cut = self.guess_cut(start, end, depth)
                if cut is not None:
                    self.apply(target, start, cut)
                    await self.pace()
                    start = pos = cut
                    cost = scanned = 0
                    continue
                may_guess = False
            number, wire, body, field_end = read_field(
                self.view, pos, end, depth, self.budget.max_unsplit_fields)
            field = layout.fields.get(number)
            kind = field.kind if field is not None and wire == 2 else _OPAQUE
            weight = field_end - pos if wire != 2 else (
                body - pos + ((field_end - body) >> _PAYLOAD_SHIFT[kind]))
            if number == layout.lifts and not depth and wire == 2 \
                    and field_end - body >= self.budget.lift_bytes:
                self.apply(target, start, pos)
                self.lift(target, body, field_end)
                await self.pace()
                start, cost, scanned, may_guess = field_end, 0, 0, True
            elif weight > budget:
                self.apply(target, start, pos)
                await self.pace()
                await self.merge_big(target, field, kind, number, (pos, body, field_end), depth)
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

    async def merge_big(self, target: _Target, field: _Field | None, kind: int, number: int,
                        span: tuple[int, int, int], depth: int) -> None:
        """One field costing more than a step: split it by its kind, or parse it whole."""
        pos, body, end = span
        if field is not None and kind in (_MESSAGE, _REPEATED):
            if depth >= MAX_NESTING:
                raise DecodeError
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
            if end - body > self.budget.max_copy_bytes:  # a map entry's string too
                raise _Unsplittable(f"a field of {end - body} bytes (field {number}) is more "
                                    f"than one step may copy")
            if field is not None and field.message is not None and kind == _MAP:
                # A map entry goes to upb whole: it must be cheap to parse.
                _check_unsplit(self.view, (body, end), field.message, depth + 1, self.budget)
            self.apply(target, pos, end)
            await self.pace()

    def lift(self, target: _Target, body: int, end: int) -> None:
        """Take the entry in ``view[body:end]`` as a view, in its place among the others."""
        layout = target.layout
        assert layout.lifts is not None  # only that field's entries are lifted
        parsed = len(getattr(target.message, layout.fields[layout.lifts].name))
        self.lifted.append((parsed + len(self.lifted), self.view[body:end]))

    async def merge_packed(self, target: _Target, number: int, kind: int, pos: int,
                           end: int) -> None:
        """A packed run is the concatenation of its elements: send it as several runs."""
        tag = encode_varint(number << 3 | 2)
        piece = self.budget.slice_bytes << _PAYLOAD_SHIFT[kind]
        if kind != _VARINTS:
            width = 4 if kind == _FIXED32S else 8
            piece = max(width, piece - piece % width)
        while pos < end:
            cut = min(pos + piece, end)
            if kind == _VARINTS and cut < end:
                cut = varint_boundary(self.view, cut, end)
            target.message.MergeFromString(
                b"".join((tag, encode_varint(cut - pos), self.view[pos:cut])))
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
        for cut in itertools.islice(plausible_cuts(self.view, target, span, limit), 3):
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


def _check_unsplit(view: memoryview, span: tuple[int, int], descriptor: Descriptor,
                   depth: int, budget: SliceBudget) -> None:
    """Refuse a part that must parse whole if upb would read too many fields in it.

    Only parsed fields count: upb copies strings, bytes and unknown fields without reading
    inside them."""
    fields, pending = 0, [(span[0], span[1], _layout(descriptor), depth)]
    while pending:
        pos, stop, layout, level = pending.pop()
        while pos < stop:
            number, wire, body, field_end = read_field(
                view, pos, stop, level, budget.max_unsplit_fields)
            field = layout.fields.get(number) if wire == 2 else None
            if field is not None and field.message is not None and field.kind in _MESSAGES:
                pending.append((body, field_end, _layout(field.message), level + 1))
            elif field is not None and field.kind == _VARINTS:
                fields += (field_end - body) >> 4  # a packed varint costs a 16th of a field
            elif wire == 3:
                fields += (field_end - body) >> 1  # as many fields as its bytes allow
            fields += 1
            if fields > budget.max_unsplit_fields:
                raise _Unsplittable(f"a map entry of {span[1] - span[0]} bytes holds more "
                                    f"than {budget.max_unsplit_fields} fields")
            pos = field_end
