"""Dynamic batcher: batch sizes, preferred sizes and the queue-delay window, on a manual clock."""

from __future__ import annotations

from tests.unit.admitted import admit
from tritium.core.cancellation import CancelReason
from tritium.core.request import AdmittedRequest, InferenceRequest
from tritium.scheduling.batcher import Batcher, BatchPlan
from tritium.scheduling.clock import ManualClock
from tritium.scheduling.policy import SchedulerPolicy
from tritium.scheduling.scheduler import ModelScheduler

MS = 1_000_000
T0 = 1_000 * MS



class FakeInstance:
    def __init__(self, name: str = "i0"):
        self.name = name
        self.batches: list[list[AdmittedRequest]] = []

    def submit(self, batch: list[AdmittedRequest]) -> None:
        self.batches.append(batch)

    def ids(self) -> list[list[str]]:
        return [[r.request.id for r in batch] for batch in self.batches]


def request(name: str, batch: int = 1, arrival_ns: int = T0) -> AdmittedRequest:
    return admit(InferenceRequest(model_name="m", inputs={}, id=name), batch, arrival_ns)


def policy(max_batch: int = 8, delay_us: int = 0, preferred: tuple[int, ...] = ()
           ) -> SchedulerPolicy:
    return SchedulerPolicy(max_batch_size=max_batch, dynamic_batching=True,
                           max_queue_delay_us=delay_us, preferred_batch_sizes=preferred)


# -- the pure decision --------------------------------------------------------
def test_without_delay_whatever_is_queued_goes_at_once() -> None:
    batcher = Batcher(policy())
    assert batcher.plan([request("a")], T0) == BatchPlan(1)
    assert batcher.plan([request(n) for n in "abc"], T0) == BatchPlan(3)
    assert batcher.plan([], T0) == BatchPlan(0)


def test_batch_dimensions_count_and_a_request_that_does_not_fit_closes_the_batch() -> None:
    batcher = Batcher(policy(max_batch=8, delay_us=1_000_000))
    queued = [request("a", 4), request("b", 3), request("c", 2), request("d", 1)]
    # 4 + 3 = 7; c (2) would make 9 and is not skipped over for d.
    assert batcher.plan(queued, T0) == BatchPlan(2)


def test_a_full_batch_goes_without_waiting_for_the_delay() -> None:
    batcher = Batcher(policy(max_batch=4, delay_us=1_000_000))
    assert batcher.plan([request("a", 2), request("b", 2), request("c")], T0) == BatchPlan(2)


def test_delay_waits_for_the_oldest_request() -> None:
    batcher = Batcher(policy(delay_us=5_000))
    queued = [request("a", arrival_ns=T0), request("b", arrival_ns=T0 + 2 * MS)]
    assert batcher.plan(queued, T0 + 3 * MS) == BatchPlan(0, T0 + 5 * MS)
    assert batcher.plan(queued, T0 + 5 * MS) == BatchPlan(2)


def test_preferred_size_goes_at_once_cut_at_the_largest_reached() -> None:
    batcher = Batcher(policy(max_batch=16, delay_us=1_000_000, preferred=(2, 4)))
    assert batcher.plan([request(n) for n in "abc"], T0) == BatchPlan(2)
    assert batcher.plan([request(n) for n in "abcde"], T0) == BatchPlan(4)
    assert batcher.plan([request("a")], T0).count == 0


def test_batches_never_exceed_the_largest_preferred_size() -> None:
    batcher = Batcher(policy(max_batch=16, delay_us=100, preferred=(4,)))
    queued = [request("a", 3), request("b", 3)]
    assert batcher.plan(queued, T0 + MS) == BatchPlan(1)
    # A request larger than every preferred size still runs, alone.
    assert batcher.plan([request("big", 10), request("x")], T0) == BatchPlan(1)


# -- the scheduler with its window timer --------------------------------------
def windowed(clock: ManualClock, **kwargs: int | tuple[int, ...]) -> tuple[ModelScheduler,
                                                                          FakeInstance]:
    scheduler = ModelScheduler("m", 1, policy(**kwargs), clock=clock)  # type: ignore[arg-type]
    instance = FakeInstance()
    scheduler.add_instances([instance])
    return scheduler, instance


def test_requests_arriving_within_the_window_share_one_execute() -> None:
    clock = ManualClock(T0)
    scheduler, instance = windowed(clock, delay_us=10_000)
    scheduler.enqueue(request("a", arrival_ns=clock.now_ns()))
    clock.advance(4 * MS)
    scheduler.enqueue(request("b", arrival_ns=clock.now_ns()))
    clock.advance(5 * MS)
    assert instance.batches == []
    clock.advance(1 * MS)
    assert instance.ids() == [["a", "b"]]
    assert scheduler.stats.queue.ns == 10 * MS + 6 * MS


def test_reaching_a_preferred_size_dispatches_before_the_window_ends() -> None:
    clock = ManualClock(T0)
    scheduler, instance = windowed(clock, delay_us=1_000_000, preferred=(3,))
    for name in "abc":
        scheduler.enqueue(request(name, arrival_ns=clock.now_ns()))
    assert instance.ids() == [["a", "b", "c"]]
    clock.advance(2_000 * MS)  # the stale window timer finds nothing to do
    assert instance.ids() == [["a", "b", "c"]]


def test_busy_instance_lets_a_batch_grow_then_takes_it_whole() -> None:
    clock = ManualClock(T0)
    scheduler, instance = windowed(clock, max_batch=4)
    scheduler.enqueue(request("first"))
    for name in ("a", "b", "c", "d", "e"):
        scheduler.enqueue(request(name))
    scheduler.batch_done(instance, instance.batches[0], 1000)
    assert instance.ids() == [["first"], ["a", "b", "c", "d"]]
    scheduler.batch_done(instance, instance.batches[1], 1000)
    assert instance.ids()[-1] == ["e"]
    stats = scheduler.stats
    assert stats.execution_count == 2 and stats.batch_requests[4] == 1
    assert stats.batches[4].count == 1


def test_cancelled_requests_are_left_out_of_a_forming_batch() -> None:
    clock = ManualClock(T0)
    scheduler, instance = windowed(clock, delay_us=10_000)
    queued = [request(n, arrival_ns=clock.now_ns()) for n in "abcd"]
    for r in queued:
        scheduler.enqueue(r)
    queued[1].cancellation.cancel(CancelReason.CLIENT_DISCONNECTED)
    scheduler.request_cancelled(queued[1])
    queued[3].cancellation.cancel(CancelReason.CLIENT_CANCELLED)  # callback not delivered yet
    clock.advance(10 * MS)
    assert instance.ids() == [["a", "c"]]
    assert scheduler.stats.pending == 0
    cancellations = scheduler.stats.cancellations
    assert cancellations[("CLIENT_DISCONNECTED", "queued")] == 1
    assert cancellations[("CLIENT_CANCELLED", "queued")] == 1


def test_without_dynamic_batching_each_execute_gets_one_request() -> None:
    scheduler = ModelScheduler("m", 1, SchedulerPolicy(max_batch_size=8))
    instance = FakeInstance()
    for name in "abc":
        scheduler.enqueue(request(name))
    scheduler.add_instances([instance])
    scheduler.batch_done(instance, instance.batches[0], 1000)
    assert instance.ids() == [["a"], ["b"]]
