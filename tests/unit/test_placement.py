"""Thread placement: the home core for server threads, every core for model code."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import pytest

from tritium.execution.placement import ThreadPlacement

ALLOWED = frozenset(os.sched_getaffinity(0))
two_cores = pytest.mark.skipif(len(ALLOWED) < 2, reason="needs two cores")


def in_thread(action: Callable[[], object]) -> object:
    """Run ``action`` in a fresh thread, so this one's affinity is left alone."""
    result: list[object] = []
    worker = threading.Thread(target=lambda: result.append(action()))
    worker.start()
    worker.join()
    return result[0]


def test_none_places_nothing() -> None:
    placement = ThreadPlacement.choose("none")
    assert not placement.active
    assert placement.describe() == "threads are not placed"

    def settle_and_read() -> frozenset[int]:
        placement.settle()
        return frozenset(os.sched_getaffinity(0))

    assert in_thread(settle_and_read) == ALLOWED
    assert placement.unrestricted_executor() is None


@two_cores
def test_auto_picks_an_allowed_core() -> None:
    placement = ThreadPlacement.choose("auto")
    assert placement.active and placement.home in ALLOWED


@two_cores
def test_settle_pins_and_release_restores() -> None:
    home = max(ALLOWED)
    placement = ThreadPlacement.choose(str(home))

    def round_trip() -> tuple[frozenset[int], frozenset[int]]:
        placement.settle()
        settled = frozenset(os.sched_getaffinity(0))
        placement.release()
        return settled, frozenset(os.sched_getaffinity(0))

    assert in_thread(round_trip) == (frozenset({home}), ALLOWED)
    assert f"core {home}" in placement.describe()


@two_cores
def test_executor_threads_run_anywhere_even_when_made_by_a_settled_thread() -> None:
    placement = ThreadPlacement.choose(str(min(ALLOWED)))
    executor = placement.unrestricted_executor()
    assert executor is not None

    def from_settled_thread() -> frozenset[int]:
        placement.settle()  # the executor's threads are started from here
        return frozenset(executor.submit(os.sched_getaffinity, 0).result())

    try:
        assert in_thread(from_settled_thread) == ALLOWED
    finally:
        executor.shutdown()


def test_a_core_outside_the_process_mask_is_refused() -> None:
    with pytest.raises(ValueError, match="not one this process may run on"):
        ThreadPlacement.choose(str(max(ALLOWED) + 4096))


@two_cores
def test_settled_threads_are_batch_threads_and_released_ones_are_not() -> None:
    placement = ThreadPlacement.choose(str(min(ALLOWED)))

    def policies() -> tuple[int, int, int]:
        placement.settle()
        settled = os.sched_getscheduler(0)
        placement.widen()  # per batch: cores only
        widened = os.sched_getscheduler(0)
        placement.release()
        return settled, widened, os.sched_getscheduler(0)

    assert in_thread(policies) == (os.SCHED_BATCH, os.SCHED_BATCH, os.SCHED_OTHER)


@two_cores
def test_widen_and_narrow_move_between_every_core_and_home() -> None:
    home = min(ALLOWED)
    placement = ThreadPlacement.choose(str(home))

    def masks() -> tuple[frozenset[int], frozenset[int]]:
        placement.settle()
        placement.widen()
        wide = frozenset(os.sched_getaffinity(0))
        placement.narrow()
        return wide, frozenset(os.sched_getaffinity(0))

    assert in_thread(masks) == (ALLOWED, frozenset({home}))


def test_auto_prefers_the_idlest_core_and_its_own_on_a_tie(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tritium.execution import placement

    samples = iter([{0: 100, 1: 100, 2: 100}, {0: 101, 1: 105, 2: 105}])
    monkeypatch.setattr(placement, "_idle_ticks", lambda: next(samples))
    assert placement._idlest_core(frozenset({0, 1, 2}), preferred=2, sample_s=0) == 2
    samples = iter([{0: 100, 1: 100}, {0: 101, 1: 105}])
    assert placement._idlest_core(frozenset({0, 1}), preferred=0, sample_s=0) == 1
    samples = iter([{}, {}])  # /proc/stat unreadable
    assert placement._idlest_core(frozenset({3, 5}), preferred=-1, sample_s=0) == 3
