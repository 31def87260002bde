"""One lock per model name, kept only while someone holds it or waits for it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class _Held:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0  # holding or waiting


class NameLocks:
    """Operations on one model name run one at a time; names nobody is using cost nothing,
    so requests for ever new names (valid or not) leave nothing behind."""

    def __init__(self) -> None:
        self._held: dict[str, _Held] = {}

    @contextlib.asynccontextmanager
    async def hold(self, name: str) -> AsyncIterator[None]:
        held = self._held.get(name)
        if held is None:
            held = self._held[name] = _Held()
        held.users += 1
        try:
            async with held.lock:
                yield
        finally:
            held.users -= 1
            if held.users == 0:
                del self._held[name]

    def __len__(self) -> int:
        return len(self._held)
