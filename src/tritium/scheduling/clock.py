"""Monotonic time and one-shot timers for the scheduler, real (event loop) or manual (tests)."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """What the scheduler needs of time: now, and a callback at a later now."""

    def now_ns(self) -> int: ...

    def call_at(self, when_ns: int, callback: Callable[[], None]) -> Timer: ...


class LoopClock:
    """``time.monotonic_ns`` (the clock requests are stamped with) and event-loop timers.

    The loop is looked up on first use, so a scheduler can be built outside the loop.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None

    # The C function itself: the scheduler reads the time several times per request, and
    # a method wrapping it would add a Python call each time.
    now_ns = staticmethod(time.monotonic_ns)

    def call_at(self, when_ns: int, callback: Callable[[], None]) -> Timer:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        # call_later rather than call_at: the loop's own time base may differ from
        # time.monotonic (uvloop caches it per iteration in milliseconds).
        delay = max(when_ns - time.monotonic_ns(), 0) / 1e9
        return self._loop.call_later(delay, callback)


class _ManualTimer:
    __slots__ = ("callback", "cancelled", "when_ns")

    def __init__(self, when_ns: int, callback: Callable[[], None]):
        self.when_ns = when_ns
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """A clock that moves only when told to; due timers fire in time order on ``advance``."""

    def __init__(self, start_ns: int = 1_000_000_000):
        self._now = start_ns
        self._timers: list[tuple[int, int, _ManualTimer]] = []
        self._order = itertools.count()

    def now_ns(self) -> int:
        return self._now

    def call_at(self, when_ns: int, callback: Callable[[], None]) -> Timer:
        timer = _ManualTimer(when_ns, callback)
        heapq.heappush(self._timers, (when_ns, next(self._order), timer))
        return timer

    def advance(self, ns: int) -> None:
        target = self._now + ns
        while self._timers and self._timers[0][0] <= target:
            when, _, timer = heapq.heappop(self._timers)
            self._now = max(self._now, when)
            if not timer.cancelled:
                timer.callback()
        self._now = target

    def pending(self) -> int:
        """How many timers are armed and not cancelled."""
        return sum(1 for _, _, timer in self._timers if not timer.cancelled)


class Alarm:
    """One re-armable timer: ``arm`` keeps the earliest requested time.

    Firing early is harmless for its users (they recompute and re-arm), so ``arm`` with a
    later time than the armed one does nothing.
    """

    def __init__(self, clock: Clock, callback: Callable[[], None]):
        self._clock = clock
        self._callback = callback
        self._timer: Timer | None = None
        self._when = 0

    def arm(self, when_ns: int) -> None:
        if self._timer is not None:
            if self._when <= when_ns:
                return
            self._timer.cancel()
        self._when = when_ns
        self._timer = self._clock.call_at(when_ns, self._fire)

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        self._callback()
