"""ModelScheduler: dispatch to free instances, batching limits, queue policies, cancellation."""

from __future__ import annotations

import pytest

from tests.unit.admitted import admit
from tritium.core.cancellation import CancelReason
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.request import AdmittedRequest, InferenceRequest, RequestStage
from tritium.scheduling.clock import ManualClock
from tritium.scheduling.policy import QueuePolicy, TimeoutAction, TimeoutOverride
from tritium.scheduling.scheduler import ModelScheduler, SchedulerPolicy

MS = 1_000_000



class FakeInstance:
    def __init__(self, name: str):
        self.name = name
        self.batches: list[list[AdmittedRequest]] = []

    def submit(self, batch: list[AdmittedRequest]) -> None:
        self.batches.append(batch)


def request(name: str, batch: int = 1, clock: ManualClock | None = None, priority: int = 0,
            timeout_us: int = 0) -> AdmittedRequest:
    r = InferenceRequest(model_name="m", inputs={}, id=name, priority=priority,
                         timeout_us=timeout_us)
    return admit(r, batch, None if clock is None else clock.now_ns())


def ids(instance: FakeInstance) -> list[list[str]]:
    return [[r.request.id for r in batch] for batch in instance.batches]


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


def test_a_request_that_finds_an_instance_free_is_counted_as_if_it_was_queued() -> None:
    clock = ManualClock()
    scheduler = ModelScheduler("m", 1, SchedulerPolicy(), clock=clock)
    instance = FakeInstance("i0")
    scheduler.add_instances([instance])
    a = request("a", clock=clock)
    clock.advance(3 * MS)
    scheduler.enqueue(a)
    assert instance.batches == [[a]] and a.stage is RequestStage.EXECUTING
    stats = scheduler.stats
    assert (stats.pending, stats.executing) == (0, 1)
    assert (stats.queue.count, stats.queue.ns) == (1, 3 * MS)


def test_a_request_cancelled_before_its_callback_ran_skips_a_free_instance() -> None:
    scheduler = ModelScheduler("m", 1, SchedulerPolicy())
    instance = FakeInstance("i0")
    scheduler.add_instances([instance])
    a = request("a")
    a.cancellation.cancel(CancelReason.CLIENT_DISCONNECTED)  # callbacks not run yet
    scheduler.enqueue(a)
    assert instance.batches == [] and a.stage is RequestStage.DONE
    assert scheduler.stats.cancellations[("CLIENT_DISCONNECTED", "queued")] == 1
    assert scheduler.stats.pending == 0


def test_dynamic_batches_respect_max_batch_size() -> None:
    policy = SchedulerPolicy(max_batch_size=4, dynamic_batching=True)
    scheduler = ModelScheduler("m", 1, policy)
    queued = [request("a", 2), request("b", 1), request("c", 2), request("d", 1)]
    for r in queued:
        scheduler.enqueue(r)
    instance = FakeInstance("i0")
    scheduler.add_instances([instance])
    assert [[r.request.id for r in batch] for batch in instance.batches] == [["a", "b"]]
    scheduler.batch_done(instance, instance.batches[0], 1000)
    assert [r.request.id for r in instance.batches[1]] == ["c", "d"]


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
    assert [batch[0].request.id for batch in instance.batches] == ["running", "after"]
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
    policy = SchedulerPolicy(dynamic_batching=True,
                             default_queue_policy=QueuePolicy(max_queue_size=1))
    scheduler = ModelScheduler("m", 1, policy)
    scheduler.enqueue(request("a"))
    with pytest.raises(TritiumError) as caught:
        scheduler.enqueue(request("b"))
    assert caught.value.code is ErrorCode.UNAVAILABLE
    assert "maximum queue size" in caught.value.message
    assert scheduler.stats.failures["REJECTED"] == 1
    assert scheduler.stats.pending == 1


def test_stopped_scheduler_refuses_new_requests() -> None:
    scheduler = ModelScheduler("m", 1, SchedulerPolicy())
    scheduler.stop_accepting()
    with pytest.raises(TritiumError) as caught:
        scheduler.enqueue(request("a"))
    assert caught.value.code is ErrorCode.UNAVAILABLE


def test_max_queue_size_is_per_priority_level() -> None:
    policy = SchedulerPolicy(
        dynamic_batching=True, priority_levels=2, default_priority=2,
        priority_queue_policies=((1, QueuePolicy(max_queue_size=1)),),
    )
    scheduler = ModelScheduler("m", 1, policy)
    scheduler.enqueue(request("high", priority=1))
    for name in ("low1", "low2", "low3"):
        scheduler.enqueue(request(name))
    with pytest.raises(TritiumError):
        scheduler.enqueue(request("high2", priority=1))
    assert scheduler.stats.pending == 4


def test_requests_leave_in_priority_order_fifo_within_a_level() -> None:
    policy = SchedulerPolicy(dynamic_batching=True, priority_levels=3, default_priority=2)
    scheduler = ModelScheduler("m", 1, policy)
    for name, priority in (("low", 3), ("mid1", 0), ("high", 1), ("mid2", 2)):
        scheduler.enqueue(request(name, priority=priority))
    instance = FakeInstance("i0")
    scheduler.add_instances([instance])
    for _ in range(3):
        scheduler.batch_done(instance, instance.batches[-1], 1000)
    assert ids(instance) == [["high"], ["mid1"], ["mid2"], ["low"]]


def test_several_idle_instances_each_take_a_request() -> None:
    scheduler = ModelScheduler("m", 1, SchedulerPolicy())
    instances = [FakeInstance(f"i{n}") for n in range(3)]
    scheduler.add_instances(instances)
    for name in ("a", "b", "c", "d"):
        scheduler.enqueue(request(name))
    assert sorted(batch[0].request.id for i in instances for batch in i.batches) == ["a", "b", "c"]
    assert scheduler.stats.executing == 3 and scheduler.stats.pending == 1


def test_request_cancelled_elsewhere_is_skipped_before_its_callback_arrives() -> None:
    # A cancel from another thread reaches the scheduler later, through the loop; the
    # request must not be handed to an instance meanwhile.
    for policy in (SchedulerPolicy(), SchedulerPolicy(max_batch_size=4, dynamic_batching=True)):
        scheduler = ModelScheduler("m", 1, policy)
        gone, kept = request("gone"), request("kept")
        scheduler.enqueue(gone)
        scheduler.enqueue(kept)
        gone.cancellation.cancel(CancelReason.CLIENT_DISCONNECTED)
        instance = FakeInstance("i0")
        scheduler.add_instances([instance])
        assert ids(instance) == [["kept"]]
        scheduler.request_cancelled(gone)  # the late callback changes nothing
        assert scheduler.stats.cancellations[("CLIENT_DISCONNECTED", "queued")] == 1
        assert scheduler.stats.pending == 0


def timeout_scheduler(action: TimeoutAction, clock: ManualClock, default_us: int = 100_000
                      ) -> tuple[ModelScheduler, FakeInstance]:
    queue_policy = QueuePolicy(timeout_action=action, default_timeout_us=default_us,
                               timeout_override=TimeoutOverride.ALLOW)
    policy = SchedulerPolicy(max_batch_size=1, dynamic_batching=True,
                             default_queue_policy=queue_policy)
    scheduler = ModelScheduler("m", 1, policy, clock=clock)
    instance = FakeInstance("i0")
    scheduler.add_instances([instance])
    scheduler.enqueue(request("busy", clock=clock))
    return scheduler, instance


def test_expired_request_is_rejected_with_deadline_and_counted_rejected() -> None:
    clock = ManualClock()
    scheduler, instance = timeout_scheduler(TimeoutAction.REJECT, clock)
    late = request("late", clock=clock)
    scheduler.enqueue(late)
    clock.advance(99 * MS)
    assert not late.cancellation.is_cancelled()
    clock.advance(1 * MS)
    assert late.cancellation.reason is CancelReason.DEADLINE
    assert late.stage is RequestStage.DONE and scheduler.stats.pending == 0
    scheduler.request_finished(late, None)
    stats = scheduler.stats
    assert stats.failures["REJECTED"] == 1 and stats.failures["CANCELED"] == 0
    assert stats.cancellations[("DEADLINE", "queued")] == 1
    assert stats.expired["REJECT"] == 1
    scheduler.batch_done(instance, instance.batches[0], 1000)
    assert ids(instance) == [["busy"]]
    assert clock.pending() == 0


def test_request_timeout_only_lowers_the_default() -> None:
    clock = ManualClock()
    scheduler, _ = timeout_scheduler(TimeoutAction.REJECT, clock)
    short, long_ = request("short", clock=clock, timeout_us=10_000), request(
        "long", clock=clock, timeout_us=10_000_000)
    scheduler.enqueue(long_)
    scheduler.enqueue(short)
    clock.advance(10 * MS)
    assert short.cancellation.is_cancelled() and not long_.cancellation.is_cancelled()
    clock.advance(90 * MS)
    assert long_.cancellation.is_cancelled()


def test_deadline_cancel_from_outside_the_queue_counts_as_canceled() -> None:
    # A gRPC deadline also cancels with DEADLINE; only queue timeouts are REJECTED.
    scheduler = ModelScheduler("m", 1, SchedulerPolicy())
    r = request("r")
    scheduler.enqueue(r)
    r.cancellation.cancel(CancelReason.DEADLINE)
    scheduler.request_cancelled(r)
    scheduler.request_finished(r, None)
    assert scheduler.stats.failures["CANCELED"] == 1
    assert scheduler.stats.failures["REJECTED"] == 0


def test_delay_moves_an_expired_request_behind_its_level() -> None:
    clock = ManualClock()
    scheduler, instance = timeout_scheduler(TimeoutAction.DELAY, clock, default_us=10_000_000)
    first = request("first", clock=clock, timeout_us=50_000)
    scheduler.enqueue(first)
    scheduler.enqueue(request("second", clock=clock))
    clock.advance(60 * MS)
    assert not first.cancellation.is_cancelled()
    assert scheduler.stats.expired["DELAY"] == 1
    for _ in range(2):
        scheduler.batch_done(instance, instance.batches[-1], 1000)
    assert ids(instance) == [["busy"], ["second"], ["first"]]
    assert scheduler.stats.pending == 0


def test_delayed_request_can_still_be_cancelled() -> None:
    clock = ManualClock()
    scheduler, instance = timeout_scheduler(TimeoutAction.DELAY, clock)
    first = request("first", clock=clock)
    scheduler.enqueue(first)
    clock.advance(200 * MS)
    first.cancellation.cancel(CancelReason.CLIENT_CANCELLED)
    scheduler.request_cancelled(first)
    scheduler.enqueue(request("next", clock=clock))
    scheduler.batch_done(instance, instance.batches[-1], 1000)
    assert ids(instance) == [["busy"], ["next"]]


def test_no_timeout_without_a_default_even_if_the_request_asks() -> None:
    clock = ManualClock()
    scheduler, _ = timeout_scheduler(TimeoutAction.REJECT, clock, default_us=0)
    r = request("r", clock=clock, timeout_us=1000)
    scheduler.enqueue(r)
    clock.advance(1000 * MS)
    assert not r.cancellation.is_cancelled()
    assert clock.pending() == 0


def test_executing_request_is_never_timed_out() -> None:
    clock = ManualClock()
    _, instance = timeout_scheduler(TimeoutAction.REJECT, clock)
    busy = instance.batches[0][0]
    clock.advance(500 * MS)
    assert not busy.cancellation.is_cancelled()


class DeepInstance(FakeInstance):
    """An instance that takes two batches at once (as a process instance does)."""

    depth = 2


def test_a_deep_instance_takes_a_second_batch_while_the_first_runs() -> None:
    scheduler = ModelScheduler("m", 1, SchedulerPolicy())
    instance = DeepInstance("i0")
    scheduler.add_instances([instance])
    a, b, c = request("a"), request("b"), request("c")
    for r in (a, b, c):
        scheduler.enqueue(r)
    # b waits at the instance and counts as queued until a is done.
    assert ids(instance) == [["a"], ["b"]] and c.stage is RequestStage.QUEUED
    assert (scheduler.stats.pending, scheduler.stats.executing) == (2, 1)
    scheduler.batch_done(instance, [a], 1000)
    assert ids(instance) == [["a"], ["b"], ["c"]]
    assert (scheduler.stats.pending, scheduler.stats.executing) == (1, 1)


def test_a_request_cancelled_while_it_waits_at_a_deep_instance_counts_as_queued() -> None:
    scheduler = ModelScheduler("m", 1, SchedulerPolicy())
    instance = DeepInstance("i0")
    scheduler.add_instances([instance])
    a, b = request("a"), request("b")
    scheduler.enqueue(a)
    scheduler.enqueue(b)
    b.cancellation.cancel(CancelReason.CLIENT_DISCONNECTED)
    scheduler.request_cancelled(b)
    scheduler.request_cancelled(b)  # idempotent
    assert scheduler.stats.cancellations[("CLIENT_DISCONNECTED", "queued")] == 1
    assert scheduler.stats.pending == 0
    scheduler.batch_done(instance, [a], 1000)  # b "begins": it was skipped
    assert scheduler.stats.executing == 0
    scheduler.batch_done(instance, [b], -1)  # the instance reports it unstarted
    assert (scheduler.stats.pending, scheduler.stats.executing) == (0, 0)
    assert scheduler.is_idle()


def test_a_free_instance_is_chosen_before_a_busy_ones_spare_place() -> None:
    scheduler = ModelScheduler("m", 1, SchedulerPolicy())
    first, second = DeepInstance("i0"), DeepInstance("i1")
    scheduler.add_instances([first, second])
    a, b, c = request("a"), request("b"), request("c")
    for r in (a, b, c):
        scheduler.enqueue(r)
    # Each instance got one batch before either got a second.
    assert sorted(len(i.batches) for i in (first, second)) == [1, 2]
    busier, other = (first, second) if len(first.batches) == 2 else (second, first)
    # The busier one finishes its first batch but still runs its second; the other one
    # finishes its only batch: the next request goes to the one that is now free.
    scheduler.batch_done(busier, busier.batches[0], 1000)
    scheduler.batch_done(other, other.batches[0], 1000)
    d = request("d")
    scheduler.enqueue(d)
    assert other.batches[-1] == [d]


def test_a_dynamic_batcher_gives_deep_instances_one_batch_at_a_time() -> None:
    policy = SchedulerPolicy(max_batch_size=4, dynamic_batching=True)
    scheduler = ModelScheduler("m", 1, policy)
    instance = DeepInstance("i0")
    scheduler.add_instances([instance])
    a = request("a")
    scheduler.enqueue(a)
    b = request("b")
    scheduler.enqueue(b)
    assert len(instance.batches) == 1


class DeeperInstance(FakeInstance):
    depth = 4


def test_a_lone_instance_takes_as_many_batches_as_it_can_hold() -> None:
    scheduler = ModelScheduler("m", 1, SchedulerPolicy())
    instance = DeeperInstance("i0")
    scheduler.add_instances([instance])
    for name in "abcde":
        scheduler.enqueue(request(name))
    assert ids(instance) == [["a"], ["b"], ["c"], ["d"]]
    assert (scheduler.stats.pending, scheduler.stats.executing) == (4, 1)


def test_instances_of_a_model_of_several_get_one_spare_place_each() -> None:
    scheduler = ModelScheduler("m", 1, SchedulerPolicy())
    first, second = DeeperInstance("i0"), DeeperInstance("i1")
    scheduler.add_instances([first, second])
    for name in "abcdef":
        scheduler.enqueue(request(name))
    assert [len(i.batches) for i in (first, second)] == [2, 2]
    assert scheduler.stats.pending == 4


def test_a_bounded_queue_keeps_deep_instances_to_one_batch() -> None:
    policy = SchedulerPolicy(default_queue_policy=QueuePolicy(max_queue_size=8))
    scheduler = ModelScheduler("m", 1, policy)
    instance = DeeperInstance("i0")
    scheduler.add_instances([instance])
    for name in "abc":
        scheduler.enqueue(request(name))
    assert ids(instance) == [["a"]]
