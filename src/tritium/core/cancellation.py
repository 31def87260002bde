"""The one definition of cancel: a state set once with a reason, read from any thread.

Invariants:
- ``reason`` goes from None to a ``CancelReason`` at most once; the first reason wins.
- ``is_cancelled()`` is a plain attribute read: models call it every token.
- Callbacks run exactly once, on the event loop the cancellation was created for,
  in registration order. A callback added after the cancel runs soon after it is added.
- A cancellation made by ``child`` or ``following`` follows its parents until it is
  cancelled or ``detach`` is called; a parent never follows its child.
"""

from __future__ import annotations

import enum
import operator
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tritium.core.errors import ErrorCode, TritiumError

if TYPE_CHECKING:
    import asyncio

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
    """Cancel state of one request, made for the event loop its callbacks run on."""

    __slots__ = ("_callbacks", "_follow", "_loop", "cancelled_at_ns", "reason")

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.reason: CancelReason | None = None
        self.cancelled_at_ns = 0
        self._loop = loop
        self._callbacks: list[Callback] | None = None
        self._follow: _Follow | None = None

    if TYPE_CHECKING:
        @property
        def loop(self) -> asyncio.AbstractEventLoop:
            """The event loop the callbacks run on."""
    else:
        # Read-only, and read for every request submitted: a C getter costs no Python call.
        loop = property(operator.attrgetter("_loop"), doc="The event loop the callbacks run on.")

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
            follow, self._follow = self._follow, None
        if follow is not None:
            follow.detach()  # nothing is left to follow
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
            callbacks = self._callbacks
            # ``in`` before ``remove`` rather than suppressing ValueError: this runs for
            # every request, and a context manager costs Python calls.
            if callbacks is not None and callback in callbacks:
                callbacks.remove(callback)

    # -- following parents ---------------------------------------------------------
    def child(self, reason: CancelReason | None = None) -> Cancellation:
        """A cancellation on the same loop, cancelled when this one is (with ``reason``,
        else with this one's reason); cancelling the child alone leaves this one be."""
        return Cancellation.following(self._loop, (self,), reason)

    @classmethod
    def following(cls, loop: asyncio.AbstractEventLoop, parents: Sequence[Cancellation],
                  reason: CancelReason | None = None) -> Cancellation:
        """A cancellation cancelled once *every* one of ``parents`` is, with ``reason``
        (else the reason of the parent cancelled last). No parents: it follows nothing.

        Call ``detach`` once the child's work is over, so that no parent keeps a
        callback for it.
        """
        child = cls(loop)
        if not parents:
            return child
        for parent in parents:
            if parent._loop is not loop:
                raise ValueError("a child cancellation must share its parents' event loop")
        last = parents[-1].reason
        if last is not None and all(parent.reason is not None for parent in parents):
            # Synchronously, even off the loop: the child must not start as if alive.
            child.cancel(reason or last)
            return child
        follow = child._follow = _Follow(child, tuple(parents), reason)
        follow.attach()
        return child

    def detach(self) -> None:
        """Stop following parents (idempotent; a no-op for a cancellation without any)."""
        if self._follow is None:
            return  # set only before the cancellation is shared, so None stays None
        with _lock:
            follow, self._follow = self._follow, None
        if follow is not None:
            follow.detach()

    # -- callbacks -----------------------------------------------------------------
    def _dispatch(self, callbacks: list[Callback]) -> None:
        loop = self._loop
        if running_loop() is loop:
            for callback in callbacks:
                callback(self)
        elif not loop.is_closed():
            loop.call_soon_threadsafe(self._run, callbacks)

    def _run(self, callbacks: list[Callback]) -> None:
        for callback in callbacks:
            callback(self)


class _Follow:
    """A child's callbacks on its parents: one mechanism for ``child`` and ``following``."""

    __slots__ = ("_child", "_parents", "_reason")

    def __init__(self, child: Cancellation, parents: tuple[Cancellation, ...],
                 reason: CancelReason | None):
        self._child = child
        self._parents = parents
        self._reason = reason

    def attach(self) -> None:
        for parent in self._parents:
            parent.add_callback(self._on_parent_cancelled)
        if self._child.reason is not None:
            # Cancelled while attaching: its own detach may have run before the last add.
            self.detach()

    def detach(self) -> None:
        for parent in self._parents:
            parent.remove_callback(self._on_parent_cancelled)

    def _on_parent_cancelled(self, parent: Cancellation) -> None:
        if all(other.reason is not None for other in self._parents):
            assert parent.reason is not None
            self._child.cancel(self._reason or parent.reason)


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, if any (no exception raised off the loop).

    Asks without importing asyncio, which an instance process of a sync model never
    does: no loop can run before it is imported.
    """
    asyncio = sys.modules.get("asyncio")
    return None if asyncio is None else asyncio._get_running_loop()
