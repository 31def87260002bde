"""Poll mode: notice models added to, removed from or changed in the repository."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

log = logging.getLogger("tritium.repository")

# Written by Python itself next to model.py; never a change an operator made.
_IGNORED_DIRS = frozenset({"__pycache__"})

Fingerprint = tuple[tuple[str, int, int], ...]


def fingerprint(model_dir: Path) -> Fingerprint:
    """Every file under ``model_dir`` as (relative path, size, mtime): any edit, added or
    removed version directory or file changes it. Empty when the directory is gone."""
    entries: list[tuple[str, int, int]] = []
    for root, dirs, files in os.walk(model_dir):
        dirs[:] = sorted(d for d in dirs if d not in _IGNORED_DIRS and not d.startswith("."))
        relative_root = os.path.relpath(root, model_dir)
        entries.append((relative_root + "/", 0, 0))  # an empty version dir counts too
        for name in sorted(files):
            try:
                stat = os.stat(os.path.join(root, name))
            except OSError:
                continue  # removed while we looked; the next poll sees the result
            entries.append((os.path.join(relative_root, name), stat.st_size, stat.st_mtime_ns))
    return tuple(entries)


class RepositoryPoller:
    """Calls ``sync`` every ``interval_s`` seconds until stopped; a failed pass is logged
    and the next one runs as planned."""

    def __init__(self, sync: Callable[[], Awaitable[None]], interval_s: float):
        self._sync = sync
        self._interval_s = interval_s
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop polling; a pass in progress finishes first, so no model is left half
        loaded."""
        self._stopping.set()
        task, self._task = self._task, None
        if task is not None:
            await task

    async def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                async with asyncio.timeout(self._interval_s):
                    await self._stopping.wait()
                return
            except TimeoutError:
                pass
            try:
                await self._sync()
            except Exception:
                log.exception("polling the model repository failed")
