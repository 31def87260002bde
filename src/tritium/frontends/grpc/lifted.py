"""A parsed request whose big ``bytes`` entries are views of the wire bytes, not copies.

upb copies a bytes field while it holds the GIL: a raw input of 1 GiB is a copy of half a
second or more during which no other client is served, wherever the parse runs. Entries of a
top-level repeated ``bytes`` field (``raw_input_contents``) past a size are therefore lifted
out of the wire before upb sees them, and the message is read through ``Lifted``, which
answers that field with the lifted views in their places.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any, overload


class LiftedEntries(Sequence[bytes | memoryview]):
    """A repeated bytes field with some entries held as read-only views beside it."""

    __slots__ = ("_indices", "_parsed", "_views")

    def __init__(self, parsed: Sequence[bytes], lifted: list[tuple[int, memoryview]]):
        self._parsed = parsed  # the entries upb parsed, in order
        self._indices = [index for index, _ in lifted]  # ascending
        self._views = [view for _, view in lifted]

    def __len__(self) -> int:
        return len(self._parsed) + len(self._indices)

    @overload
    def __getitem__(self, index: int) -> bytes | memoryview: ...

    @overload
    def __getitem__(self, index: slice) -> list[bytes | memoryview]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("entry index out of range")
        before = bisect.bisect_left(self._indices, index)
        if before < len(self._indices) and self._indices[before] == index:
            return self._views[before]
        return self._parsed[index - before]


class Lifted:
    """Reads as ``message``, except that ``field`` answers ``entries``."""

    __slots__ = ("_entries", "_field", "_message")

    def __init__(self, message: Any, field: str, entries: LiftedEntries):
        self._message = message
        self._field = field
        self._entries = entries

    def __getattr__(self, name: str) -> Any:
        if name == self._field:
            return self._entries
        return getattr(self._message, name)
