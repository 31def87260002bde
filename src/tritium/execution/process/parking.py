"""Where an instance process waits for batches: on the server loop's core, when batches come
one at a time and are short.

One request at a time, the server and the instance process take turns: each wakes the other
and sleeps. With the two on different cores every turn wakes a sleeping core, which on the
virtual machines servers run on costs more than the turn's Python; on one core a turn is a
plain switch (identity, one request at a time: 299 -> 265 µs of CPU per inference). So
after ``PARK_AFTER`` short batches in a row that each found no other waiting, the process
*parks* on the loop's core (the "home" core of thread placement, placement.py) and stays
there while that holds.

Model code runs on every allowed core otherwise, as in an instance thread, and parking
never keeps it from them for long: a batch that ran ``SHORT_EXECUTE_NS`` or longer, or one
that finds others waiting (load: then the process runs beside the loop), moves the process
back; so does a model that starts a thread while parked (every thread of the process is
moved back, and the process no longer parks: a thread pool must not stay on one core).
Decoupled models, whose work goes on in threads after ``execute`` returns, never park;
``--python-threads-core none`` turns parking off with thread placement.
"""

from __future__ import annotations

import os
import threading

from tritium.execution.placement import set_affinity

# Shorter than this, moving back and forth between batches would cost more than they run.
SHORT_EXECUTE_NS = 200_000
# Short batches that each found no other waiting, in a row, before the process parks: under
# a light load batches alternate between alone and not, and moving at each would cost more.
PARK_AFTER = 8


class Parking:
    def __init__(self, home: int | None, everywhere: frozenset[int]) -> None:
        self._home = frozenset((home,)) if home is not None and everywhere else frozenset()
        self._everywhere = everywhere
        self.parked = False
        self._threads = 0  # the process's Python threads when it parked
        self._alone = 0  # short batches in a row that found no other waiting
        self.active = bool(self._home)  # read after every batch: a plain attribute

    def batch_done(self, elapsed_ns: int, waiting: bool) -> None:
        """A batch took ``elapsed_ns``; ``waiting``: another batch is here already. Called
        before the batch is answered, so that the answer wakes the loop from the core the
        process will wait on."""
        if self.parked:
            if threading.active_count() != self._threads:
                self._stop()  # the model started a thread while parked
            elif elapsed_ns >= SHORT_EXECUTE_NS or waiting:
                self.unpark()
        elif elapsed_ns >= SHORT_EXECUTE_NS or waiting:
            self._alone = 0
        else:
            self._alone += 1
            if self._alone >= PARK_AFTER and self._home:
                self.parked = True
                self._threads = threading.active_count()
                set_affinity(self._home)

    def unpark(self) -> None:
        """Back on every core (more batches wait: load, not turn-taking)."""
        self.parked = False
        self._alone = 0
        set_affinity(self._everywhere)

    def _stop(self) -> None:
        self.unpark()
        self._home = frozenset()
        self.active = False
        try:
            tasks = [int(task) for task in os.listdir("/proc/self/task")]
        except OSError:
            return
        for task in tasks:
            try:
                os.sched_setaffinity(task, self._everywhere)
            except OSError:
                continue  # ended meanwhile, or refused: it keeps what it had
