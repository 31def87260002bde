"""ModelScheduler: dispatch to free instances, batching limits, queued cancellation."""

from __future__ import annotations

import pytest

from tritium.core.cancellation import CancelReason
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.request import InferenceRequest, RequestStage
from tritium.scheduling.scheduler import ModelScheduler, SchedulerPolicy


class FakeInstance:
    def __init__(self, name: str):
        self.name = name
        self.batches: list[list[InferenceRequest]] = []

    def submit(self, batch: list[InferenceRequest]) -> None:
        self.batches.append(batch)


def request(name: str, batch: int = 1) -> InferenceRequest:
    r = InferenceRequest(model_name="m", inputs={}, id=name)
    r.batch_size = batch
    return r


def test_one_request_per_execute_without_dynamic_batching() -> None:
    scheduler = ModelScheduler("m", 1, SchedulerPolicy())
    instance = FakeInstance("i0")
    scheduler.add_instances([instance])
    a, b = request("a"), request("b")
    scheduler.enqueue(a)
    scheduler.enqueue(b)
    assert instance.batches == [[a]]
    assert a.stage is RequestStage.EXECUTING and b.stage is RequestStage.QUEUED
    scheduler.batch_done(instance, [a], 1000)
    assert instance.batches == [[a], [b]]
    assert a.stage is RequestStage.DONE


def test_dynamic_batches_respect_max_batch_size() -> None:
    policy = SchedulerPolicy(max_batch_size=4, dynamic_batching=True)
    scheduler = ModelScheduler("m", 1, policy)
    queued = [request("a", 2), request("b", 1), request("c", 2), request("d", 1)]
    for r in queued:
        scheduler.enqueue(r)
    instance = FakeInstance("i0")
    scheduler.add_instances([instance])
    assert [[r.id for r in batch] for batch in instance.batches] == [["a", "b"]]
    scheduler.batch_done(instance, instance.batches[0], 1000)
    assert [r.id for r in instance.batches[1]] == ["c", "d"]


def test_cancelled_queued_request_never_reaches_an_instance() -> None:
    scheduler = ModelScheduler("m", 1, SchedulerPolicy())
    instance = FakeInstance("i0")
    scheduler.add_instances([instance])
    running, waiting, after = request("running"), request("waiting"), request("after")
    for r in (running, waiting, after):
        scheduler.enqueue(r)
    waiting.cancellation.cancel(CancelReason.CLIENT_DISCONNECTED)
    scheduler.request_cancelled(waiting)
    assert scheduler.stats.cancellations[("CLIENT_DISCONNECTED", "queued")] == 1
    scheduler.batch_done(instance, [running], 1000)
    assert [batch[0].id for batch in instance.batches] == ["running", "after"]
    assert scheduler.stats.pending == 0


def test_cancel_of_an_executing_request_is_counted_as_executing() -> None:
    scheduler = ModelScheduler("m", 1, SchedulerPolicy())
    scheduler.add_instances([FakeInstance("i0")])
    r = request("r")
    scheduler.enqueue(r)
    r.cancellation.cancel(CancelReason.CLIENT_CANCELLED)
    scheduler.request_cancelled(r)
    assert scheduler.stats.cancellations[("CLIENT_CANCELLED", "executing")] == 1
    scheduler.request_finished(r, None)
    assert scheduler.stats.failures["CANCELED"] == 1


def test_full_queue_rejects_with_unavailable() -> None:
    scheduler = ModelScheduler("m", 1, SchedulerPolicy(max_queue_size=1))
    scheduler.enqueue(request("a"))
    with pytest.raises(TritiumError) as caught:
        scheduler.enqueue(request("b"))
    assert caught.value.code is ErrorCode.UNAVAILABLE
    assert "maximum queue size" in caught.value.message


def test_stopped_scheduler_refuses_new_requests() -> None:
    scheduler = ModelScheduler("m", 1, SchedulerPolicy())
    scheduler.stop_accepting()
    with pytest.raises(TritiumError) as caught:
        scheduler.enqueue(request("a"))
    assert caught.value.code is ErrorCode.UNAVAILABLE
