"""The one codec for everything that crosses the process boundary.

A frame is a 4-byte little-endian length and a msgpack array ``[tag, *fields]`` naming one
of the message types of messages.py. msgpack (C) carries only plain values (None, bool,
int, float, str, bytes, arrays, maps): nothing on the wire can name a type to build or code
to run, as a pickle can. Dataclasses travel as arrays of their fields, in order; decoding
checks every field against the dataclass's annotations before building it, so a frame is
either one well-formed message or a ``FrameError``. Frames larger than ``MAX_FRAME`` are
refused before a byte of their body is buffered.
"""

from __future__ import annotations

import dataclasses
import operator
import struct
import types
import typing
from collections.abc import Callable
from typing import Any

import msgpack

LENGTH = struct.Struct("<I")
MAX_FRAME = 64 << 20  # metadata, and tensors inline only when no arena block fits
_MAX_DEPTH = 32


class FrameError(Exception):
    """A frame that is not a well-formed message: its sender is broken or hostile."""


Convert = Callable[[Any], Any]
_converters: dict[Any, Convert] = {}
_by_tag: dict[int, type] = {}
_getters: dict[type, Callable[[Any], Any]] = {}


def message(tag: int) -> Callable[[type], type]:
    """Register a dataclass as the message type ``tag`` names on the wire."""
    def register(cls: type) -> type:
        if tag in _by_tag:
            raise ValueError(f"message tag {tag} is taken by {_by_tag[tag].__name__}")
        _by_tag[tag] = cls
        cls.TAG = tag  # type: ignore[attr-defined]
        return cls
    return register


# -- encoding ------------------------------------------------------------------------


def _fields_of(obj: Any) -> Any:
    """A dataclass's field values in order (msgpack packs the tuple as an array)."""
    getter = _getters.get(type(obj))
    if getter is None:
        getter = _getter(type(obj))
    return getter(obj)


def _getter(cls: type) -> Callable[[Any], Any]:
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} cannot cross the process boundary")
    names = tuple(f.name for f in dataclasses.fields(cls))
    # One C call per value (attrgetter), not a loop of getattr: every frame goes through it.
    if len(names) > 1:
        getter: Callable[[Any], Any] = operator.attrgetter(*names)
    elif names:
        one = operator.attrgetter(names[0])
        getter = lambda obj: (one(obj),)  # noqa: E731
    else:
        getter = lambda obj: ()  # noqa: E731
    _getters[cls] = getter
    return getter


_packer_options = {"use_bin_type": True, "default": _fields_of}


def encode(msg: Any) -> bytes:
    """One frame: the length, then ``[tag, *fields]``."""
    body = msgpack.packb((msg.TAG, *_fields_of(msg)), **_packer_options)
    if len(body) > MAX_FRAME:
        raise FrameError(f"a {type(msg).__name__} frame of {len(body)} bytes exceeds the "
                         f"limit of {MAX_FRAME}")
    return LENGTH.pack(len(body)) + body


def pack_value(value: Any) -> bytes:
    """A plain value (dataclasses as arrays), as ``unpack_value`` reads it."""
    packed: bytes = msgpack.packb(value, **_packer_options)
    return packed


def unpack_value(data: bytes | memoryview) -> Any:
    try:
        # The frame's length was checked against MAX_FRAME before it was buffered.
        return msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:
        raise FrameError(f"undecodable value: {exc}") from None


# -- decoding ------------------------------------------------------------------------


def decode(body: bytes | memoryview) -> Any:
    """The message one frame's body holds; ``FrameError`` if it holds anything else."""
    try:
        # The frame's length was checked against MAX_FRAME before it was buffered.
        wire = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as exc:
        raise FrameError(f"undecodable value: {exc}") from None
    if type(wire) is not list or not wire or type(wire[0]) is not int:
        raise FrameError("a frame is not a tagged array")
    # Straight to the message type's compiled checks: every frame comes through here.
    build = _decoders.get(wire[0])
    if build is None:
        cls = _by_tag.get(wire[0])
        if cls is None:
            raise FrameError(f"unknown message tag {wire[0]}")
        build = _decoders[wire[0]] = _compiled(cls)
    try:
        return build(wire[1:])
    except FrameError:
        raise
    except (TypeError, ValueError) as exc:
        raise FrameError(f"bad {_by_tag[wire[0]].__name__}: {exc}") from None


_decoders: dict[int, Convert] = {}


def convert(tp: Any, value: Any) -> Any:
    """``value`` (plain, as decoded) checked against the type ``tp`` and built into it."""
    try:
        return _converter(tp)(value)
    except FrameError:
        raise
    except (TypeError, ValueError) as exc:
        raise FrameError(f"bad {getattr(tp, '__name__', tp)}: {exc}") from None


def _converter(tp: Any) -> Convert:
    found = _converters.get(tp)
    if found is None:
        found = _converters[tp] = _build(tp)
    return found


def _build(tp: Any) -> Convert:
    if tp is Any:
        return _any
    if tp in (int, str, bytes, bool, float, type(None)):
        return _scalar(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _struct(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        return _union([_converter(a) for a in args])
    if origin is list:
        item = _converter(args[0])
        return lambda v: [item(x) for x in _array(v)]
    if origin is tuple:
        return _tuple(args)
    if origin is dict:
        key, val = _converter(args[0]), _converter(args[1])
        return lambda v: {key(k): val(x) for k, x in _map(v).items()}
    raise TypeError(f"no wire form for {tp!r}")


def _scalar(tp: type) -> Convert:
    if tp is float:
        def to_float(v: Any) -> float:
            if type(v) not in (float, int):
                raise FrameError(f"expected a number, got {type(v).__name__}")
            return float(v)
        return to_float

    def check(v: Any) -> Any:
        if type(v) is not tp:
            raise FrameError(f"expected {tp.__name__}, got {type(v).__name__}")
        return v
    return check


def _any(v: Any) -> Any:
    return v


def _union(options: list[Convert]) -> Convert:
    def pick(v: Any) -> Any:
        for option in options:
            try:
                return option(v)
            except FrameError:
                continue
        raise FrameError(f"no alternative takes a {type(v).__name__}")
    return pick


def _tuple(args: tuple[Any, ...]) -> Convert:
    if len(args) == 2 and args[1] is Ellipsis:
        item = _converter(args[0])
        return lambda v: tuple(item(x) for x in _array(v))
    items = [_converter(a) for a in args]

    def fixed(v: Any) -> tuple[Any, ...]:
        values = _array(v)
        if len(values) != len(items):
            raise FrameError(f"expected {len(items)} items, got {len(values)}")
        return tuple(c(x) for c, x in zip(items, values, strict=True))
    return fixed


def _struct(cls: type) -> Convert:
    # Compiled on first use: a dataclass may name itself (or a later one) in a field.
    compiled: list[Convert] = []

    def build(v: Any) -> Any:
        if not compiled:
            compiled.append(_compiled(cls))
        return compiled[0](v)
    return build


_SCALARS = (int, str, bytes, bool, type(None))
_compiled_structs: dict[type, Convert] = {}
_compiling: set[type] = set()


def _compiled(cls: type) -> Convert:
    found = _compiled_structs.get(cls)
    if found is None:
        _compiling.add(cls)
        try:
            found = _compiled_structs[cls] = _compile_struct(cls)
        finally:
            _compiling.discard(cls)
    return found


def _compile_struct(cls: type) -> Convert:
    """A converter for ``cls`` written out as straight-line code: every frame on the
    channel goes through one, and a closure per field and per item cost more than the
    rest of a small request's trip through the server (measured: 11 µs of decoding a
    one-request Execute, against 4 this way)."""
    hints = typing.get_type_hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init]
    required = sum(1 for f in fields if f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING)
    names: dict[str, Any] = {"cls": cls, "_wrong": _wrong,
                             "_slow": _generic_struct(cls, hints, fields, required)}
    lines = ["def build(v):",
             f"    if type(v) is not list or len(v) != {len(fields)}:",
             "        return _slow(v)"]
    for i, field in enumerate(fields):
        lines.append(f"    x{i} = v[{i}]")
        lines.extend(_field_check(f"x{i}", field.name, hints[field.name], names, "    "))
    arguments = ", ".join(f"x{i}" for i in range(len(fields)))
    lines.append(f"    return cls({arguments})")
    # Only field names and types of our own dataclasses go into the code, never wire data.
    exec(compile("\n".join(lines), f"<codec {cls.__name__}>", "exec"), names)
    built: Convert = names["build"]
    return built


def _field_check(x: str, name: str, tp: Any, names: dict[str, Any], indent: str
                 ) -> list[str]:
    """Lines that check (and convert in place) the value in variable ``x`` against ``tp``."""
    union = typing.get_origin(tp) in (types.UnionType, typing.Union)
    options = typing.get_args(tp) if union else (tp,)
    key = f"{x}_{len(names)}"
    if tp is Any:
        return []
    if all(option in _SCALARS for option in options):
        names[f"t{key}"] = options
        return [f"{indent}if type({x}) not in t{key}:",
                f"{indent}    _wrong({name!r}, t{key}, {x})"]
    if union and len(options) == 2 and type(None) in options:
        inner = options[0] if options[1] is type(None) else options[1]
        return [f"{indent}if {x} is not None:",
                *_field_check(x, name, inner, names, indent + "    ")]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list or (origin is tuple and len(args) == 2 and args[1] is Ellipsis):
        names[f"seq{key}"] = (list,)
        lines = [f"{indent}if type({x}) is not list:",
                 f"{indent}    _wrong({name!r}, seq{key}, {x})"]
        if args[0] in _SCALARS:
            names[f"t{key}"] = (args[0],)
            lines += [f"{indent}for y in {x}:",
                      f"{indent}    if type(y) not in t{key}:",
                      f"{indent}        _wrong({name!r}, t{key}, y)"]
        else:
            names[f"c{key}"] = _fast(args[0])
            lines.append(f"{indent}{x} = [c{key}(y) for y in {x}]")
        return [*lines, f"{indent}{x} = tuple({x})"] if origin is tuple else lines
    names[f"c{key}"] = _fast(tp)
    return [f"{indent}{x} = c{key}({x})"]


def _fast(tp: Any) -> Convert:
    """The converter of ``tp``: a dataclass's compiled one unless it is being compiled."""
    if isinstance(tp, type) and dataclasses.is_dataclass(tp) and tp not in _compiling:
        return _compiled(tp)
    return _converter(tp)


def _wrong(name: str, options: tuple[type, ...], value: Any) -> None:
    expected = " or ".join("None" if t is type(None) else t.__name__ for t in options)
    raise FrameError(f"{name}: expected {expected}, got {type(value).__name__}")


def _generic_struct(cls: type, hints: dict[str, Any], fields: list[Any], required: int
                    ) -> Convert:
    """The field-by-field converter: values not of the common shape (a dataclass built
    already, fields left to their defaults, anything malformed) come here."""
    converters = [_converter(hints[f.name]) for f in fields]

    def build(v: Any) -> Any:
        if type(v) is cls:  # built already (a value that never crossed)
            return v
        values = _array(v)
        if not required <= len(values) <= len(fields):
            raise FrameError(f"{cls.__name__} has {len(fields)} fields, got {len(values)}")
        return cls(*[c(x) for c, x in zip(converters, values, strict=False)])
    return build


def _array(v: Any) -> list[Any]:
    if type(v) is not list:
        raise FrameError(f"expected an array, got {type(v).__name__}")
    return v


def _map(v: Any) -> dict[Any, Any]:
    if type(v) is not dict:
        raise FrameError(f"expected a map, got {type(v).__name__}")
    return v


# -- framing -------------------------------------------------------------------------


class FrameReader:
    """Cuts a byte stream into frame bodies, at most ``limit`` per call; keeps the rest.

    A length above ``MAX_FRAME`` raises ``FrameError`` at once: nothing of such a frame is
    buffered. Bodies are decoded by the caller, so that it can bound the work of one turn.
    """

    def __init__(self) -> None:
        self._pending = bytearray()
        self._at = 0  # where the next frame starts in _pending

    def feed(self, data: bytes | memoryview) -> None:
        if self._at:
            del self._pending[:self._at]
            self._at = 0
        self._pending += data

    def bodies(self, limit: int) -> list[bytes]:
        """Up to ``limit`` complete frame bodies, in order."""
        out: list[bytes] = []
        pending, at, end = self._pending, self._at, len(self._pending)
        while len(out) < limit and end - at >= 4:
            (length,) = LENGTH.unpack_from(pending, at)
            if length > MAX_FRAME:
                raise FrameError(f"a frame announces {length} bytes, over the limit of "
                                 f"{MAX_FRAME}")
            if end - at - 4 < length:
                break
            out.append(bytes(pending[at + 4:at + 4 + length]))
            at += 4 + length
        self._at = at
        if at == end:
            self._pending.clear()
            self._at = 0
        return out

    def has_frame(self) -> bool:
        """Whether a complete frame is waiting (so more input need not be read yet)."""
        avail = len(self._pending) - self._at
        if avail < 4:
            return False
        (length,) = LENGTH.unpack_from(self._pending, self._at)
        return length > MAX_FRAME or avail - 4 >= length

    def buffered(self) -> int:
        return len(self._pending) - self._at
