"""Parsing a large JSON document a piece at a time, so that no one parse holds the GIL long.

orjson holds the GIL for the whole of a ``loads`` call (seconds for tens of MiB of numbers),
so a big body parsed on a worker thread still stops the event loop. Here the document is cut
at commas outside strings, about every ``piece`` bytes; each cut's enclosing containers are
known from a vectorized scan, so each piece is parsed on its own, wrapped in synthetic
brackets, and the results are merged along the open containers.

Why the result is orjson's own: piece 0 starts where the document does, so orjson tokenizes
it exactly as it would the whole; if it parses with our closers, our scan was right about the
first cut (outside a string, inside exactly those containers), and so on, piece by piece.
A document the scan misreads (a stray backslash outside strings) fails some piece's parse,
which is the right answer for it: it is not JSON.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

MAX_DEPTH = 1024  # deeper nesting is refused (orjson's own bound is close to it)

_QUOTE, _BACKSLASH, _COMMA = 34, 92, 44
_OPENERS = {91: 93, 123: 125}  # [ ] and { }
_CLOSERS = frozenset(_OPENERS.values())
_WHITESPACE = b" \t\r\n"
_ARRAY, _OBJECT = 91, 123


class JsonError(ValueError):
    """The document is not JSON (the message says where, as orjson's would)."""


class TooManyValues(JsonError):
    """The document is JSON, perhaps, but holds more values than its reader allows."""


# One open container: its opening byte ([ or {) and where it opened.
_Open = tuple[int, int]


PIECE = 256 * 1024  # bytes per parse: a few milliseconds of orjson


def loads(data: bytes | bytearray | memoryview, piece: int = PIECE,
          max_tokens: int | None = None, progress: Callable[[Any], None] | None = None
          ) -> Any:
    """``orjson.loads(data)``, parsed ``piece`` bytes at a time. With ``max_tokens``, a
    document of more brackets and commas (outside strings) than that is refused by the scan,
    before a single Python object is built for it: each value costs far more memory than its
    bytes. ``progress(root)`` sees the document as merged so far after each piece, and may
    raise to stop there (a reader that can tell the rest is not worth parsing)."""
    text = _whole_buffer(data)
    if len(text) <= piece:
        return _loads(text)
    cuts = _Scanner(text, piece, max_tokens).cuts()
    if not cuts:
        return _loads(text)
    return _Merger(text, cuts, progress).run()


def _whole_buffer(data: bytes | bytearray | memoryview) -> bytes | bytearray:
    """``data`` as the object it views when it views all of one (a body is held once, never
    copied to be parsed); a copy only of a part of one."""
    if isinstance(data, memoryview):
        whole = data.obj
        if isinstance(whole, bytes | bytearray) and data.nbytes == len(whole) \
                and data.contiguous:
            return whole
        return bytes(data)
    return data


def _loads(text: bytes | bytearray) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise JsonError(str(exc)) from None


# ------------------------------------------------------------------------------- scan


class _Scanner:
    """Finds the cuts: one comma outside strings near the end of each block, with the
    containers open there."""

    def __init__(self, text: bytes | bytearray, block: int, max_tokens: int | None = None):
        self.text = text
        self.block = block
        self.tokens_left = max_tokens
        self.in_string = False
        self.backslashes = 0  # length of the run of backslashes that ended the last block
        self.stack: list[_Open] = []

    def cuts(self) -> list[tuple[int, list[_Open]]]:
        found: list[tuple[int, list[_Open]]] = []
        for start in range(0, len(self.text), self.block):
            cut = self._scan_block(start, min(start + self.block, len(self.text)))
            if cut is not None:
                found.append(cut)
        return found

    def _scan_block(self, start: int, end: int) -> tuple[int, list[_Open]] | None:
        block = np.frombuffer(self.text, np.uint8, end - start, start)
        quotes = self._real_quotes(block)
        self._count_backslashes(block)
        kinds = np.isin(block, _STRUCTURAL)
        positions = np.flatnonzero(kinds)
        # A structural byte is inside a string when an odd number of real quotes precede it.
        before = np.searchsorted(quotes, positions) + int(self.in_string)
        positions = positions[(before & 1) == 0]
        self.in_string ^= bool(quotes.size & 1)
        if not positions.size:
            return None
        if self.tokens_left is not None:
            self.tokens_left -= positions.size
            if self.tokens_left < 0:
                raise TooManyValues("the JSON document holds too many values")
        chars = block[positions]
        delta = np.where(np.isin(chars, _OPEN_BYTES), 1, np.where(chars == _COMMA, 0, -1))
        depth = np.cumsum(delta) + len(self.stack)
        if depth.min() < 0:
            where = start + int(positions[int(np.argmin(depth))])
            raise JsonError(f"unexpected closing bracket near byte {where}")
        if depth.max() > MAX_DEPTH:
            raise JsonError(f"JSON nesting depth exceeds maximum allowed limit ({MAX_DEPTH})")
        commas = np.flatnonzero(chars == _COMMA)
        cut = None
        if commas.size:
            last = int(commas[-1])
            if depth[last] == 0:
                raise JsonError(f"trailing characters near byte {start + int(positions[last])}")
            stack = self._stack_at(start, positions, chars, depth, last)
            cut = (start + int(positions[last]), stack)
        self.stack = self._stack_at(start, positions, chars, depth, len(positions) - 1)
        return cut

    def _real_quotes(self, block: np.ndarray) -> np.ndarray:
        """Positions of the quotes not escaped by an odd run of backslashes."""
        quotes = np.flatnonzero(block == _QUOTE)
        if not quotes.size:
            return quotes
        after_backslash = np.zeros(quotes.size, dtype=bool)
        inner = quotes > 0
        after_backslash[inner] = block[quotes[inner] - 1] == _BACKSLASH
        if quotes[0] == 0 and self.backslashes:
            after_backslash[0] = True
        if not after_backslash.any():
            return quotes
        runs = np.array([self._run_before(block, int(q)) for q in quotes[after_backslash]])
        escaped = np.zeros(quotes.size, dtype=bool)
        escaped[after_backslash] = (runs & 1) == 1
        return quotes[~escaped]

    def _run_before(self, block: np.ndarray, position: int) -> int:
        # Escaped quotes are rare outside hostile input, and each run is walked once.
        run = 0
        while position - run - 1 >= 0 and block[position - run - 1] == _BACKSLASH:
            run += 1
        return run + self.backslashes if run == position else run

    def _count_backslashes(self, block: np.ndarray) -> None:
        others = np.flatnonzero(block != _BACKSLASH)
        if not others.size:
            self.backslashes += block.size
        else:
            self.backslashes = block.size - 1 - int(others[-1])

    def _stack_at(self, start: int, positions: np.ndarray, chars: np.ndarray,
                  depth: np.ndarray, index: int) -> list[_Open]:
        """The containers open just after structural byte ``index`` of this block."""
        depth = depth[: index + 1]
        floor = min(len(self.stack), int(depth.min()))
        # An opener stays open if nothing after it (up to ``index``) goes below its depth.
        later_min = np.minimum.accumulate(depth[::-1])[::-1]
        later_min = np.append(later_min[1:], np.iinfo(np.int64).max)
        openers = np.isin(chars[: index + 1], _OPEN_BYTES)
        kept = np.flatnonzero(openers & (later_min >= depth) & (depth > floor))
        stack = self.stack[:floor]
        stack.extend((int(chars[i]), start + int(positions[i])) for i in kept)
        return stack


_STRUCTURAL = np.frombuffer(b"[]{},", np.uint8)
_OPEN_BYTES = np.frombuffer(b"[{", np.uint8)


# ------------------------------------------------------------------------------ merge


class _Merger:
    """Parses the pieces between cuts and grows one document from them."""

    def __init__(self, text: bytes | bytearray, cuts: list[tuple[int, list[_Open]]],
                 progress: Callable[[Any], None] | None = None):
        self.text = text
        self.cuts = cuts
        self.progress = progress
        # The synthetic key under which an object's open member continues in a piece; a
        # fresh one per document, so no client can collide with it.
        self.key = "\x00" + secrets.token_hex(8)
        self.prefix_key = orjson.dumps(self.key) + b":"

    def run(self) -> Any:
        text = self.text
        previous: list[_Open] = []
        root: Any = None
        start = 0
        for end, stack in [*self.cuts, (len(text), [])]:
            self._check_cut(start, end, stack)
            body = text[start:end]
            parsed = _loads(self._prefix(previous) + body + self._closers(stack))
            if previous:
                self._merge(root, previous, parsed)
            else:
                root = parsed
            previous, start = stack, end + 1
            if self.progress is not None and stack:
                self.progress(root)
        return root

    def _check_cut(self, start: int, end: int, stack: list[_Open]) -> None:
        """Our brackets would hide ``[,1]``, ``[1,]`` and ``{"a":,``: refuse them here."""
        if end == len(self.text):
            return
        last = _back_over(self.text, end - 1, _WHITESPACE)
        before = self.text[last : last + 1] if last >= start else b""
        next_at = _forward_over(self.text, end + 1, _WHITESPACE)
        after = self.text[next_at : next_at + 1]
        if not before or before in b"[{,:" or (after and after in b"]},"):
            raise JsonError(f"unexpected ',' at byte {end}")

    def _prefix(self, stack: list[_Open]) -> bytes:
        parts = []
        for level, (kind, _) in enumerate(stack):
            if kind == _ARRAY:
                parts.append(b"[")
            elif level == len(stack) - 1:
                parts.append(b"{")  # the piece goes on with this object's next member
            else:
                parts.append(b"{" + self.prefix_key)
        return b"".join(parts)

    @staticmethod
    def _closers(stack: list[_Open]) -> bytes:
        return bytes(_OPENERS[kind] for kind, _ in reversed(stack))

    def _merge(self, root: Any, stack: list[_Open], parsed: Any) -> None:
        target = root
        for level, (kind, _) in enumerate(stack):
            if level == len(stack) - 1:
                if kind == _ARRAY:
                    target.extend(parsed)
                else:
                    target.update(parsed)
                return
            if kind == _ARRAY:
                inner, rest = parsed[0], parsed[1:]
                following = target[-1]
                target.extend(rest)
            else:
                inner = parsed.pop(self.key)
                following = target[self._open_key(stack[level + 1][1])]
                target.update(parsed)
            target, parsed = following, inner

    def _open_key(self, opened_at: int) -> str:
        """The key whose value is the container opened at ``opened_at``."""
        text = self.text
        colon = _back_over(text, opened_at - 1, _WHITESPACE)
        close = _back_over(text, colon - 1, _WHITESPACE)
        open_quote = close
        while True:
            open_quote = text.rindex(b'"', 0, open_quote)
            if (open_quote - 1 - _back_over(text, open_quote - 1, b"\\")) % 2 == 0:
                break
        key = _loads(text[open_quote : close + 1])
        assert isinstance(key, str)
        return key


def _forward_over(text: bytes | bytearray, index: int, skipped: bytes) -> int:
    """The first index at or after ``index`` whose byte is not in ``skipped``."""
    while index < len(text) and text[index] in skipped:
        index += 1
    return index


def _back_over(text: bytes | bytearray, index: int, skipped: bytes) -> int:
    """The last index at or before ``index`` whose byte is not in ``skipped`` (-1: none)."""
    while index >= 0 and text[index] in skipped:
        index -= 1
    return index
