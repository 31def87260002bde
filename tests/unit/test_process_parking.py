"""When an instance process parks on the loop's core, and when it leaves (parking.py)."""

from __future__ import annotations

import os
import threading

import pytest

from tritium.execution.process import parking
from tritium.execution.process.parking import PARK_AFTER, SHORT_EXECUTE_NS, Parking

SHORT, LONG = SHORT_EXECUTE_NS // 10, SHORT_EXECUTE_NS
# This process's own cores: moving every thread back (a thread started while parked) then
# changes nothing for the tests that follow.
EVERY = frozenset(os.sched_getaffinity(0))
HOME = min(EVERY)


@pytest.fixture
def moves(monkeypatch: pytest.MonkeyPatch) -> list[frozenset[int]]:
    """The affinities the process would have set, in order (the test's own stays)."""
    seen: list[frozenset[int]] = []
    monkeypatch.setattr(parking, "set_affinity", seen.append)
    return seen


def test_it_parks_after_short_batches_alone_in_a_row(moves: list[frozenset[int]]) -> None:
    place = Parking(HOME, EVERY)
    for _ in range(PARK_AFTER - 1):
        place.batch_done(SHORT, waiting=False)
    place.batch_done(SHORT, waiting=True)  # another waited: the count starts over
    for _ in range(PARK_AFTER - 1):
        place.batch_done(SHORT, waiting=False)
    assert not place.parked and moves == []
    place.batch_done(SHORT, waiting=False)
    assert place.parked and moves == [frozenset({HOME})]


@pytest.mark.parametrize(("elapsed", "waiting"), [(LONG, False), (SHORT, True)],
                         ids=["long", "load"])
def test_a_long_batch_or_load_moves_it_back(moves: list[frozenset[int]], elapsed: int,
                                            waiting: bool) -> None:
    place = Parking(HOME, EVERY)
    for _ in range(PARK_AFTER):
        place.batch_done(SHORT, waiting=False)
    place.batch_done(elapsed, waiting)
    assert not place.parked and moves[-1] == EVERY
    for _ in range(PARK_AFTER - 1):  # and it takes a full run of short batches again
        place.batch_done(SHORT, waiting=False)
    assert not place.parked


def test_a_thread_started_while_parked_ends_parking(moves: list[frozenset[int]]) -> None:
    place = Parking(HOME, EVERY)
    for _ in range(PARK_AFTER):
        place.batch_done(SHORT, waiting=False)
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        place.batch_done(SHORT, waiting=False)
        assert not place.parked and not place.active
        for _ in range(PARK_AFTER * 2):
            place.batch_done(SHORT, waiting=False)
        assert not place.parked
    finally:
        stop.set()
        worker.join()


def test_without_a_home_core_it_never_parks(moves: list[frozenset[int]]) -> None:
    place = Parking(None, EVERY)
    for _ in range(PARK_AFTER * 2):
        place.batch_done(SHORT, waiting=False)
    assert not place.parked and not place.active and moves == []
