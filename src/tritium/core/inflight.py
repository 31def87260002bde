"""A set of unfinished things and a wait for it to become empty.

Servers, models and connections all ask one question while they drain: "is anything of mine
still running?". This is the one answer, so no component hand-writes the future it wakes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class InFlight(Generic[T]):
    """Insertion-ordered members; ``wait_empty`` returns once none is left.

    Loop-only: members are added and removed on the event loop that waits.
    """

    __slots__ = ("_empty", "_members", "add")

    def __init__(self) -> None:
        self._members: dict[T, None] = {}
        self._empty: asyncio.Event | None = None  # exists only while someone waits
        # ``add(member)``: the dict's own setdefault (the value is None), so adding, done
        # for every request and call, runs no Python frame.
        self.add: Callable[[T], object] = self._members.setdefault

    def discard(self, member: T) -> None:
        self._members.pop(member, None)
        # Nobody waits (``_empty`` None) in the usual case: one test, then done.
        if self._empty is not None and not self._members:
            self._empty.set()

    def __len__(self) -> int:
        return len(self._members)

    def __bool__(self) -> bool:
        return bool(self._members)

    def __contains__(self, member: object) -> bool:
        return member in self._members

    def __iter__(self) -> Iterator[T]:
        """A snapshot: members may be discarded while the caller iterates."""
        return iter(list(self._members))

    async def wait_empty(self) -> None:
        """Return once no member is left (at once if none is)."""
        while self._members:
            if self._empty is None or self._empty.is_set():
                self._empty = asyncio.Event()
            await self._empty.wait()

    async def left_after(self, timeout_s: float) -> list[T]:
        """Wait up to ``timeout_s`` for the set to empty; the members still in it then."""
        try:
            async with asyncio.timeout(timeout_s):
                await self.wait_empty()
        except TimeoutError:
            pass
        return list(self._members)
