"""OldestSequenceScheduler: requests of several sequences batched on one instance."""

from __future__ import annotations

from typing import Any

from tests.unit.admitted import admit
from tests.unit.test_sequences import MS, FakeInstance, finish, request
from tritium.core.cancellation import CancelReason
from tritium.core.request import (
    RELEASE_RESCHEDULE,
    SEQUENCE_END,
    SEQUENCE_START,
    AdmittedRequest,
    InferenceRequest,
)
from tritium.scheduling.clock import ManualClock
from tritium.scheduling.policy import OldestPolicy, SchedulerPolicy, SequencePolicy
from tritium.scheduling.sequence_oldest import OldestSequenceScheduler

START, END = SEQUENCE_START, SEQUENCE_END


def make(instances: int = 1, max_batch_size: int = 4, oldest: OldestPolicy | None = None,
         iterative: bool = False
         ) -> tuple[OldestSequenceScheduler, list[FakeInstance], ManualClock]:
    clock = ManualClock()
    policy = SchedulerPolicy(max_batch_size=max_batch_size, sequence=SequencePolicy(
        oldest=oldest or OldestPolicy(), iterative=iterative))
    scheduler = OldestSequenceScheduler("old", 1, policy, clock=clock)
    pool = [FakeInstance(f"i{n}") for n in range(instances)]
    scheduler.add_instances(pool)
    return scheduler, pool, clock


def timed(name: str, correlation_id: int, clock: ManualClock) -> AdmittedRequest:
    """A sequence's START request that arrives now by ``clock``."""
    decoded = InferenceRequest(model_name="old", inputs={}, id=name,
                               correlation_id=correlation_id, flags=START)
    return admit(decoded, arrival_ns=clock.now_ns())


def batches(instance: FakeInstance) -> list[list[str]]:
    return [[r.request.id for r in batch] for batch in instance.batches]


def test_requests_of_different_sequences_share_a_batch() -> None:
    """Triton docs "Oldest": the sequence batcher routes every request of a sequence to one
    instance and uses the dynamic batcher to batch requests of different sequences."""
    scheduler, (i0,), _ = make()
    scheduler.enqueue(request("a1", 1, START))  # the instance is free: runs at once
    for name, cid in (("b1", 2), ("c1", 3)):
        scheduler.enqueue(request(name, cid, START))
    scheduler.enqueue(request("a2", 1))
    finish(scheduler, i0)
    # a2 could join only once a1 was done: one request per sequence at a time.
    assert batches(i0) == [["a1"], ["b1", "c1", "a2"]]
    finish(scheduler, i0)
    assert scheduler.is_idle()


def test_one_request_per_sequence_per_batch_and_in_order() -> None:
    """OldestSequenceBatch keeps one request of a sequence in flight; the next is issued
    to the batcher when it completes."""
    scheduler, (i0,), _ = make()
    scheduler.enqueue(request("a1", 1, START))
    scheduler.enqueue(request("a2", 1))
    scheduler.enqueue(request("a3", 1, END))
    for _ in range(3):
        finish(scheduler, i0)
    assert batches(i0) == [["a1"], ["a2"], ["a3"]] and scheduler.is_idle()


def test_the_batch_is_capped_by_max_batch_size() -> None:
    scheduler, (i0,), _ = make(max_batch_size=2, oldest=OldestPolicy(max_candidate_sequences=8))
    scheduler.enqueue(request("x", 9, START))
    for n in range(3):
        scheduler.enqueue(request(f"s{n}", n + 1, START))
    finish(scheduler, i0)
    assert batches(i0) == [["x"], ["s0", "s1"]]
    finish(scheduler, i0)
    assert batches(i0)[-1] == ["s2"]


def test_max_queue_delay_waits_for_a_fuller_batch() -> None:
    """``oldest { max_queue_delay_microseconds }`` goes to the dynamic batcher: a batch
    smaller than the preferred size waits until its oldest request has waited that long."""
    oldest = OldestPolicy(preferred_batch_sizes=(2,), max_queue_delay_us=10_000)
    scheduler, (i0,), clock = make(oldest=oldest)
    scheduler.enqueue(timed("a1", 1, clock))
    assert i0.batches == []
    clock.advance(5 * MS)
    scheduler.enqueue(timed("b1", 2, clock))
    assert batches(i0) == [["a1", "b1"]]  # the preferred size goes at once
    finish(scheduler, i0)
    scheduler.enqueue(timed("c1", 3, clock))
    clock.advance(9 * MS)
    assert len(i0.batches) == 1
    clock.advance(1 * MS)
    assert batches(i0)[-1] == ["c1"]


def test_sequences_keep_to_their_instance() -> None:
    scheduler, (i0, i1), _ = make(instances=2)
    scheduler.enqueue(request("a1", 1, START))
    scheduler.enqueue(request("b1", 2, START))
    scheduler.enqueue(request("b2", 2))
    finish(scheduler, i0)
    finish(scheduler, i1)
    assert (batches(i0), batches(i1)) == ([["a1"]], [["b1"], ["b2"]])


def test_a_rescheduled_request_joins_the_next_batch() -> None:
    """Iterative sequences with the oldest strategy: rescheduled requests of several
    sequences are batched together again (continuous batching)."""
    scheduler, (i0,), _ = make(iterative=True)
    first = request("a", 0)
    scheduler.enqueue(first)
    scheduler.enqueue(request("b", 0))
    first.release_flags = RELEASE_RESCHEDULE
    finish(scheduler, i0)
    assert batches(i0) == [["a"], ["b", "a"]]
    assert first.request.flags == 0
    finish(scheduler, i0)
    assert scheduler.is_idle()


def test_a_cancelled_issued_request_is_dropped_from_the_batch() -> None:
    scheduler, (i0,), _ = make()
    scheduler.enqueue(request("a1", 1, START))
    gone = request("b1", 2, START)
    scheduler.enqueue(gone)
    scheduler.enqueue(request("c1", 3, START))
    gone.cancellation.cancel(CancelReason.CLIENT_CANCELLED)
    scheduler.request_cancelled(gone)
    finish(scheduler, i0)
    assert batches(i0) == [["a1"], ["c1"]]
    assert scheduler.stats.cancellations[("CLIENT_CANCELLED", "queued")] == 1


def test_sequences_past_max_candidate_sequences_wait_in_the_backlog() -> None:
    """Triton docs "Oldest": a new sequence that finds no instance with room for another
    candidate sequence goes to the backlog; when a sequence ends, a backlogged one takes
    its place (``max_candidate_sequences`` per instance)."""
    scheduler, (i0,), _ = make(oldest=OldestPolicy(max_candidate_sequences=2))
    scheduler.enqueue(request("a1", 1, START))
    scheduler.enqueue(request("b1", 2, START))
    scheduler.enqueue(request("c1", 3, START))  # backlogged: a and b are the candidates
    scheduler.enqueue(request("c2", 3))
    finish(scheduler, i0)
    assert batches(i0) == [["a1"], ["b1"]]
    scheduler.enqueue(request("a2", 1, END))  # a ends: c takes its place once a2 is done
    finish(scheduler, i0)
    assert batches(i0)[-1] == ["a2"]  # never a2 and c1 together: 3 sequences in a batch
    scheduler.enqueue(request("d1", 4, START))  # behind c in the backlog: waits
    finish(scheduler, i0)
    assert batches(i0)[-1] == ["c1"]
    finish(scheduler, i0)
    assert batches(i0)[-1] == ["c2"]
    finish(scheduler, i0)
    assert scheduler.stats.pending == 1 and ["d1"] not in batches(i0)


def test_a_backlogged_sequence_takes_the_place_of_a_cancelled_one() -> None:
    scheduler, (i0,), _ = make(oldest=OldestPolicy(max_candidate_sequences=1))
    scheduler.enqueue(request("a1", 1, START))
    gone = request("a2", 1)
    scheduler.enqueue(gone)
    scheduler.enqueue(request("b1", 2, START))
    gone.cancellation.cancel(CancelReason.CLIENT_CANCELLED)
    scheduler.request_cancelled(gone)  # a is released with its queued request
    finish(scheduler, i0)
    assert batches(i0) == [["a1"], ["b1"]]


class WakeOrder:
    """Stands in for a response stream: records when its responses are let go."""

    def __init__(self, name: str, log: list[str]):
        self.name, self.log = name, log

    def _wake(self) -> None:
        self.log.append(self.name)


def test_preserve_ordering_delivers_batches_in_dispatch_order() -> None:
    """``oldest { preserve_ordering: true }`` goes to the dynamic batcher: responses leave in
    the order their batches were dispatched, whichever instance finishes first."""
    scheduler, (i0, i1), _ = make(instances=2, oldest=OldestPolicy(preserve_ordering=True))
    scheduler.enqueue(request("a1", 1, START))
    scheduler.enqueue(request("b1", 2, START))
    delivered: list[str] = []
    woken_b: list[Any] = [WakeOrder("b1", delivered)]
    scheduler.batch_done(i1, i1.batches[-1], 1000, woken_b)
    assert delivered == []  # held until a1's batch, dispatched first, is delivered
    woken_a: list[Any] = [WakeOrder("a1", delivered)]
    scheduler.batch_done(i0, i0.batches[-1], 1000, woken_a)
    assert delivered == ["a1", "b1"]


def test_a_backlogged_sequence_whose_end_is_queued_still_runs() -> None:
    """Triton keeps a backlogged sequence's queue (END included) until a slot frees."""
    scheduler, (i0,), _ = make(oldest=OldestPolicy(max_candidate_sequences=1))
    scheduler.enqueue(request("a1", 1, START))
    scheduler.enqueue(request("b1", 2, START))  # backlogged: one candidate sequence
    scheduler.enqueue(request("b2", 2, END))  # ends it while it still waits
    scheduler.enqueue(request("a2", 1, END))
    for _ in range(4):
        finish(scheduler, i0)
    assert batches(i0) == [["a1"], ["a2"], ["b1"], ["b2"]]
    assert scheduler.is_idle() and scheduler.stats.pending == 0


def test_a_backlogged_sequence_cancelled_leaves_the_backlog() -> None:
    scheduler, (i0,), _ = make(oldest=OldestPolicy(max_candidate_sequences=1))
    scheduler.enqueue(request("a1", 1, START))
    b1 = request("b1", 2, START)
    scheduler.enqueue(b1)
    b1.cancellation.cancel(CancelReason.CLIENT_CANCELLED)
    scheduler.request_cancelled(b1)
    scheduler.enqueue(request("c1", 3, START))  # backlogged behind nobody now
    scheduler.enqueue(request("a2", 1, END))
    for _ in range(3):
        finish(scheduler, i0)
    assert batches(i0) == [["a1"], ["a2"], ["c1"]]
