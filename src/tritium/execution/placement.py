"""Which cores the server's Python threads run on.

Only one thread runs Python at a time (the GIL), and every request crosses from the event
loop to a model instance thread and back. When those two threads sit on different cores,
each crossing wakes a sleeping thread on the other core, which on the virtual machines
servers run on costs more CPU than all of the request's Python put together (measured: about
160 µs per identity inference, against about 70 µs with both threads on one core). So the
event loop and the instance threads share one "home" core while they run server code (as
batch threads, see ``settle``), and
model code (``initialize``, ``execute``, ``finalize``, and every thread it starts) runs on
any core the process may use, so native thread pools (BLAS, torch) keep all of them.

An instance process shares no GIL with the loop and is not placed so, but it waits for short
batches that come one at a time on the home core too (process/parking.py).

Linux only (``os.sched_setaffinity`` sets the calling thread's mask there); elsewhere, and on
a single allowed core, placement does nothing.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor  # instance processes never need it

log = logging.getLogger("tritium.execution")


class ThreadPlacement:
    """The home core (None: threads are not placed) and the cores model code may use."""

    def __init__(self, home: int | None = None, everywhere: frozenset[int] | None = None):
        self.home = home
        self._home = frozenset((home,)) if home is not None else frozenset()
        self._everywhere = everywhere or frozenset()

    @classmethod
    def choose(cls, setting: str) -> ThreadPlacement:
        """``setting``: "auto" (the idlest core, preferring the one this thread runs on), a
        core number, or "none".
        Raises ValueError for a core the process may not use."""
        if setting == "none" or not hasattr(os, "sched_setaffinity"):
            return cls()
        try:
            allowed = frozenset(os.sched_getaffinity(0))
        except OSError as exc:  # a sandbox that hides CPU masks: leave threads alone
            log.warning("thread placement off: cannot read the CPU mask (%s)", exc)
            return cls()
        if setting == "auto":
            if len(allowed) < 2:
                return cls()  # nothing to choose between
            home = _idlest_core(allowed, _current_core())
        else:
            home = int(setting)
            if home not in allowed:
                raise ValueError(f"core {home} is not one this process may run on "
                                 f"({_ranges(allowed)})")
        return cls(home, allowed)

    @property
    def active(self) -> bool:
        return self.home is not None

    @property
    def everywhere(self) -> frozenset[int]:
        """The cores model code may use (empty when threads are not placed)."""
        return self._everywhere

    def settle(self) -> None:
        """Keep the calling thread on the home core, as a batch thread: waking it never
        preempts the thread running there, which would only block at once on the GIL that
        thread holds (an idle wake-up wastes two context switches each way otherwise)."""
        if self._home:
            set_affinity(self._home)
            _policy(_BATCH)

    def release(self) -> None:
        """Let the calling thread (about to run model code) use every allowed core, under
        the ordinary scheduling policy (threads model code starts inherit both)."""
        if self._home:
            set_affinity(self._everywhere)
            _policy(_NORMAL)

    def widen(self) -> None:
        """Let a settled thread use every allowed core while it runs model code (until
        ``narrow``); one system call, as the thread stays a batch thread."""
        if self._home:
            set_affinity(self._everywhere)

    def narrow(self) -> None:
        """Back to the home core after ``widen``."""
        if self._home:
            set_affinity(self._home)

    def unrestricted_executor(self) -> ThreadPoolExecutor | None:
        """An executor whose threads run anywhere (they may import and run model code); None
        when threads are not placed."""
        if not self._home:
            return None
        from concurrent.futures import ThreadPoolExecutor

        return ThreadPoolExecutor(thread_name_prefix="tritium-worker", initializer=self.release)

    def describe(self) -> str:
        if self.home is None:
            return "threads are not placed"
        return (f"event loop and idle instance threads on core {self.home}; model code on "
                f"cores {_ranges(self._everywhere)}")


_BATCH = getattr(os, "SCHED_BATCH", 3)
_NORMAL = getattr(os, "SCHED_OTHER", 0)


def _policy(policy: int) -> None:
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))
    except (OSError, AttributeError) as exc:  # a sandbox may refuse; placement still helps
        log.debug("cannot set scheduling policy %d: %s", policy, exc)


def set_affinity(cores: frozenset[int]) -> None:
    """Run the calling thread on ``cores`` (logged at debug level where that is refused)."""
    try:
        os.sched_setaffinity(0, cores)
    except OSError as exc:  # a cgroup may have taken cores away since startup
        log.debug("cannot set thread affinity to %s: %s", sorted(cores), exc)


def _idlest_core(allowed: frozenset[int], preferred: int, sample_s: float = 0.05) -> int:
    """The allowed core that was idle longest over a short sample (``preferred`` on a tie),
    so a server does not settle on a core another process keeps busy."""
    before = _idle_ticks()
    time.sleep(sample_s)
    after = _idle_ticks()
    if not before or not after:
        return preferred if preferred in allowed else min(allowed)

    def idleness(core: int) -> tuple[int, bool]:
        return after.get(core, 0) - before.get(core, 0), core == preferred

    return max(sorted(allowed), key=idleness)


def _idle_ticks() -> dict[int, int]:
    """Idle plus iowait ticks per core, from /proc/stat ({} where it cannot be read)."""
    ticks: dict[int, int] = {}
    try:
        with open("/proc/stat") as stat:
            for line in stat:
                name, _, rest = line.partition(" ")
                if name.startswith("cpu") and name[3:].isdigit():
                    fields = rest.split()
                    ticks[int(name[3:])] = int(fields[3]) + int(fields[4])
    except (OSError, IndexError, ValueError):
        return {}
    return ticks


def _current_core() -> int:
    """The core the calling thread last ran on (field 39 of /proc/thread-self/stat)."""
    try:
        with open("/proc/thread-self/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[36])
    except (OSError, IndexError, ValueError):
        return -1


def _ranges(cores: frozenset[int]) -> str:
    return ",".join(str(core) for core in sorted(cores))


# The server's placement, set once at startup; instance threads read it as they start and
# around model code. Affinity is a property of threads, so one process-wide value is the
# honest shape for it.
_current = ThreadPlacement()


def current() -> ThreadPlacement:
    return _current


def install(placement: ThreadPlacement) -> None:
    global _current
    _current = placement
