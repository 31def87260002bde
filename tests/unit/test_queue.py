"""RequestQueue: FIFO per priority level, lazy O(1) removal of cancelled requests."""

from __future__ import annotations

from tests.unit.admitted import admit
from tritium.core.request import AdmittedRequest, InferenceRequest, RequestStage
from tritium.scheduling.queue import RequestQueue


def request(name: str, priority: int = 0) -> AdmittedRequest:
    return admit(InferenceRequest(model_name="m", inputs={}, id=name, priority=priority))


def test_fifo_within_a_level() -> None:
    queue = RequestQueue()
    a, b, c = request("a"), request("b"), request("c")
    for r in (a, b, c):
        queue.push(r)
    assert len(queue) == 3
    assert [queue.pop(), queue.pop(), queue.pop()] == [a, b, c]
    assert queue.pop() is None


def test_higher_priority_first_and_default_level() -> None:
    queue = RequestQueue(priority_levels=3, default_priority=2)
    low, default, high = request("low", 3), request("default", 0), request("high", 1)
    for r in (low, default, high):
        queue.push(r)
    assert [r.request.id for r in queue.drain()] == ["high", "default", "low"]


def test_out_of_range_priority_uses_default_level() -> None:
    queue = RequestQueue(priority_levels=2, default_priority=2)
    first, odd = request("first", 2), request("odd", 9)
    queue.push(first)
    queue.push(odd)
    assert [r.request.id for r in queue.drain()] == ["first", "odd"]


def test_discarded_request_is_skipped_and_not_counted() -> None:
    queue = RequestQueue()
    a, b = request("a"), request("b")
    queue.push(a)
    queue.push(b)
    assert queue.discard(a)
    assert len(queue) == 1
    assert a.stage is RequestStage.DONE
    assert queue.pop() is b
    assert not queue.discard(a)


def test_discard_of_a_request_not_queued_is_refused() -> None:
    queue = RequestQueue()
    r = request("x")
    queue.push(r)
    assert queue.pop() is r
    r.move_to(RequestStage.EXECUTING)
    assert not queue.discard(r)
    assert r.stage is RequestStage.EXECUTING
