"""The one definition of cancel: a state set once with a reason, read from any thread.

Invariants:
- ``reason`` goes from None to a ``CancelReason`` at most once; the first reason wins.
- ``is_cancelled()`` is a plain attribute read: models call it every token.
- Callbacks run exactly once, on the event loop the cancellation was created for,
  in registration order. A callback added after the cancel runs soon after it is added.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import threading
import time
from collections.abc import Callable

from tritium.core.errors import ErrorCode, TritiumError

Callback = Callable[["Cancellation"], None]


class CancelReason(enum.Enum):
    CLIENT_DISCONNECTED = "client disconnected"
    CLIENT_CANCELLED = "client cancelled"
    DEADLINE = "deadline exceeded"
    SHUTDOWN = "server shutting down"
    UNLOADED = "model unloaded"
    PARENT_CANCELLED = "parent request cancelled"

    def to_error(self) -> TritiumError:
        """The error a client that is still listening receives."""
        if self is CancelReason.DEADLINE:
            # Triton answers an expired queue timeout with UNAVAILABLE; clients rely on it.
            return TritiumError(ErrorCode.UNAVAILABLE, "Request timeout expired")
        if self in (CancelReason.SHUTDOWN, CancelReason.UNLOADED):
            return TritiumError(ErrorCode.UNAVAILABLE, f"Request cancelled: {self.value}")
        return TritiumError(ErrorCode.CANCELLED, f"Request cancelled: {self.value}")


_lock = threading.Lock()


class Cancellation:
    """Cancel state of one request (or of a group sharing it, such as BLS children)."""

    __slots__ = ("_callbacks", "_loop", "cancelled_at_ns", "reason")

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None):
        self.reason: CancelReason | None = None
        self.cancelled_at_ns = 0
        self._loop = loop
        self._callbacks: list[Callback] | None = None

    def is_cancelled(self) -> bool:
        return self.reason is not None

    def cancel(self, reason: CancelReason) -> bool:
        """Request cancellation from any thread; returns False if it was already cancelled."""
        with _lock:
            if self.reason is not None:
                return False
            self.cancelled_at_ns = time.monotonic_ns()
            self.reason = reason
            callbacks, self._callbacks = self._callbacks, None
        if callbacks:
            self._dispatch(callbacks)
        return True

    def add_callback(self, callback: Callback) -> None:
        with _lock:
            if self.reason is None:
                if self._callbacks is None:
                    self._callbacks = [callback]
                else:
                    self._callbacks.append(callback)
                return
        self._dispatch([callback])

    def remove_callback(self, callback: Callback) -> None:
        with _lock:
            if self._callbacks is not None:
                with contextlib.suppress(ValueError):
                    self._callbacks.remove(callback)

    def link_child(self, child: Cancellation) -> None:
        """Make ``child`` follow this cancellation with reason PARENT_CANCELLED."""
        def follow(_: Cancellation) -> None:
            child.cancel(CancelReason.PARENT_CANCELLED)

        self.add_callback(follow)

    def _dispatch(self, callbacks: list[Callback]) -> None:
        loop = self._loop
        if loop is None or _running_loop() is loop:
            for callback in callbacks:
                callback(self)
        elif not loop.is_closed():
            loop.call_soon_threadsafe(self._run, callbacks)

    def _run(self, callbacks: list[Callback]) -> None:
        for callback in callbacks:
            callback(self)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
