"""Protobuf wire format read in Python: where fields begin and end, framed as upb frames them.

Every ``DecodeError`` raised here marks bytes that upb refuses too."""

from __future__ import annotations

from collections.abc import Iterator

from google.protobuf.message import DecodeError

# upb refuses a message nested deeper than this many sub-messages and groups.
MAX_NESTING = 100


class GroupTooLarge(Exception):
    """A group holds more fields than the caller will read one by one."""


def read_varint(view: memoryview, pos: int, end: int, most: int) -> tuple[int, int]:
    """(value, end) of the varint at ``pos``, at most ``most`` bytes long."""
    value = shift = 0
    for index in range(pos, min(pos + most, end)):
        byte = view[index]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, index + 1
        shift += 7
    raise DecodeError


def read_tag(view: memoryview, pos: int, end: int) -> tuple[int, int, int]:
    """(field number, wire type, end) of the tag at ``pos``: five bytes, 32 bits at most."""
    tag, pos = read_varint(view, pos, end, 5)
    if tag < 8 or tag > 0xFFFFFFFF:
        raise DecodeError
    return tag >> 3, tag & 7, pos


def read_field(view: memoryview, pos: int, end: int, depth: int,
               group_fields: int) -> tuple[int, int, int, int]:
    """(number, wire type, payload start, end) of the field at ``pos``, ``depth`` levels down.

    A group is read through to its end, and may hold at most ``group_fields`` fields."""
    number, wire, body = read_tag(view, pos, end)
    if wire == 3:
        field_end = group_end(view, body, end, number, MAX_NESTING - depth, group_fields)
    else:
        body, field_end = skip_value(view, wire, body, end)
    return number, wire, body, field_end


def skip_value(view: memoryview, wire: int, pos: int, end: int) -> tuple[int, int]:
    """(payload start, end) of a field's value that is not a group."""
    if wire == 0:
        field_end = read_varint(view, pos, end, 10)[1]
    elif wire == 2:
        size, pos = read_varint(view, pos, end, 10)
        if size >= 0x7FFFFFFF:
            raise DecodeError
        field_end = pos + size
    elif wire in (1, 5):
        field_end = pos + (8 if wire == 1 else 4)
    else:
        raise DecodeError  # an end-group outside its group, or wire type 6 or 7
    if field_end > end:
        raise DecodeError
    return pos, field_end


def group_end(view: memoryview, pos: int, end: int, number: int, room: int,
              most: int) -> int:
    """Where the group opened with ``number`` closes, nesting at most ``room`` deep."""
    opened = [number]
    for _ in range(most):
        if len(opened) > room:
            raise DecodeError  # deeper than upb's nesting limit
        inner, wire, pos = read_tag(view, pos, end)
        if wire == 4:
            if inner != opened.pop():
                raise DecodeError
            if not opened:
                return pos
        elif wire == 3:
            opened.append(inner)
        else:
            pos = skip_value(view, wire, pos, end)[1]
    raise GroupTooLarge(f"a group holds more than {most} fields")


def varint_boundary(view: memoryview, pos: int, end: int) -> int:
    """The first element boundary at or after ``pos`` in a packed varint run."""
    for index in range(pos - 1, min(pos + 9, end)):
        if view[index] < 0x80:
            return index + 1
    raise DecodeError


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def plausible_cuts(view: memoryview, target: int, span: int, limit: int) -> Iterator[int]:
    """Ends of four fields decoding cleanly from points in ``[target, +span)``: guesses at
    a field boundary, to be checked, since a point inside a field can decode as fields too."""
    seen = set()
    for first in range(target, min(target + span, limit)):
        pos = first
        try:
            for _ in range(4):
                wire, pos = read_tag(view, pos, limit)[1:]
                if wire == 3:
                    raise DecodeError  # a group: too costly to follow in a guess
                pos = skip_value(view, wire, pos, limit)[1]
        except DecodeError:
            continue
        if pos not in seen:
            seen.add(pos)
            yield pos
