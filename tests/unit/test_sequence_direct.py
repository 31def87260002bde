"""DirectSequenceScheduler: one batch slot (lane) per sequence, padding for empty lanes."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests.unit.admitted import admit
from tests.unit.test_sequences import FakeInstance, finish, refused
from tritium.core.cancellation import CancelReason
from tritium.core.errors import ErrorCode
from tritium.core.request import (
    RELEASE_RESCHEDULE,
    SEQUENCE_END,
    SEQUENCE_START,
    AdmittedRequest,
    InferenceRequest,
)
from tritium.core.types import DataType, Tensor
from tritium.scheduling.clock import ManualClock
from tritium.scheduling.policy import (
    ControlKind,
    DirectPolicy,
    SchedulerPolicy,
    SequenceControl,
    SequencePolicy,
)
from tritium.scheduling.sequence_direct import DirectSequenceScheduler

START, END = SEQUENCE_START, SEQUENCE_END
CONTROLS = (
    SequenceControl("START", ControlKind.START, DataType.INT32),
    SequenceControl("READY", ControlKind.READY, DataType.FP32),
    SequenceControl("CORRID", ControlKind.CORRID, DataType.UINT64),
)


def make(instances: int = 1, max_batch_size: int = 4, direct: DirectPolicy | None = None
         ) -> tuple[DirectSequenceScheduler, list[FakeInstance], ManualClock]:
    clock = ManualClock()
    policy = SchedulerPolicy(max_batch_size=max_batch_size, sequence=SequencePolicy(
        controls=CONTROLS, direct=direct or DirectPolicy()))
    scheduler = DirectSequenceScheduler("direct", 1, policy, clock=clock)
    pool = [FakeInstance(f"i{n}") for n in range(instances)]
    scheduler.add_instances(pool)
    return scheduler, pool, clock


def request(name: str, correlation_id: int, flags: int = 0, value: float = 1.0,
            clock: ManualClock | None = None, width: int = 1) -> AdmittedRequest:
    data = np.full((1, width), value, dtype=np.float32)
    decoded = InferenceRequest(model_name="direct", id=name, correlation_id=correlation_id,
                               flags=flags,
                               inputs={"IN": Tensor("IN", DataType.FP32, (1, width), data)})
    return admit(decoded, arrival_ns=None if clock is None else clock.now_ns())


def lanes(batch: list[AdmittedRequest]) -> list[str]:
    """The batch by lane: a request's id, or "-" for padding."""
    return [r.request.id or "-" for r in batch]


def control(r: AdmittedRequest, name: str) -> float:
    return float(r.request.inputs[name].data.reshape(-1)[0])


def test_each_sequence_keeps_its_lane_and_empty_lanes_are_padded() -> None:
    """Triton docs "Direct": a sequence is assigned a batch slot and keeps it; a batch
    covers the slots up to the highest one with a request, the others filled with
    not-ready requests."""
    scheduler, (i0,), _ = make()
    scheduler.enqueue(request("a1", 1, START))
    finish(scheduler, i0)
    scheduler.enqueue(request("b1", 2, START))
    finish(scheduler, i0)
    scheduler.enqueue(request("c1", 3, START))
    finish(scheduler, i0)
    scheduler.enqueue(request("b2", 2))
    assert [lanes(b) for b in i0.batches] == [["a1"], ["-", "b1"], ["-", "-", "c1"], ["-", "b2"]]
    finish(scheduler, i0)
    assert scheduler.is_idle() and scheduler.stats.pending == 0


def test_padding_is_a_zeroed_copy_with_ready_false() -> None:
    scheduler, (i0,), _ = make()
    scheduler.enqueue(request("a1", 7, START, value=5.0))
    finish(scheduler, i0)
    scheduler.enqueue(request("b1", 8, START, value=3.0))
    padding, real = i0.batches[-1]
    assert control(real, "READY") == 1 and control(real, "CORRID") == 8
    assert control(padding, "READY") == 0 and control(padding, "START") == 0
    assert control(padding, "CORRID") == 0
    pad_in = padding.request.inputs["IN"]
    assert pad_in.shape == (1, 1) and float(pad_in.data[0, 0]) == 0.0
    assert padding.request.requested_output_names() == []
    assert padding.request.correlation_id == 0 and padding.request.flags == 0


def test_queued_requests_of_several_sequences_run_in_one_batch() -> None:
    scheduler, (i0,), _ = make()
    scheduler.enqueue(request("a1", 1, START))  # runs at once
    scheduler.enqueue(request("b1", 2, START))
    scheduler.enqueue(request("c1", 3, START))
    scheduler.enqueue(request("a2", 1))
    scheduler.enqueue(request("a3", 1))
    finish(scheduler, i0)
    finish(scheduler, i0)
    # One request per sequence per batch, in order.
    assert [lanes(b) for b in i0.batches] == [["a1"], ["a2", "b1", "c1"], ["a3"]]
    stats = scheduler.stats
    assert stats.executing == 1 and stats.queue.count == 5  # padding is not counted


def test_an_ended_sequence_frees_its_lane_for_the_next() -> None:
    scheduler, (i0,), _ = make(max_batch_size=2)
    scheduler.enqueue(request("a1", 1, START))
    finish(scheduler, i0)
    scheduler.enqueue(request("b1", 2, START))
    finish(scheduler, i0)
    scheduler.enqueue(request("a2", 1, END))
    finish(scheduler, i0)
    scheduler.enqueue(request("d1", 4, START))
    assert lanes(i0.batches[-1]) == ["d1"]  # lane 0 again


def test_a_sequence_without_a_free_lane_waits_in_the_backlog() -> None:
    """Triton's sequence batcher: with every slot taken a new sequence is backlogged until
    one ends."""
    scheduler, (i0,), _ = make(max_batch_size=2)
    scheduler.enqueue(request("a1", 1, START))
    scheduler.enqueue(request("b1", 2, START))
    scheduler.enqueue(request("c1", 3, START))
    scheduler.enqueue(request("c2", 3))
    finish(scheduler, i0)
    assert [lanes(b) for b in i0.batches] == [["a1"], ["-", "b1"]]
    scheduler.enqueue(request("a2", 1, END))
    for _ in range(3):
        finish(scheduler, i0)
    # c took a's lane once a's END had run; its requests stay in order.
    assert [lanes(b) for b in i0.batches[2:]] == [["a2"], ["c1"], ["c2"]]


def test_two_instances_fill_lane_zero_first() -> None:
    scheduler, (i0, i1), _ = make(instances=2, max_batch_size=2)
    for name, cid in (("a", 1), ("b", 2), ("c", 3)):
        scheduler.enqueue(request(name, cid, START))
    assert [lanes(b) for b in i0.batches] == [["a"]]
    assert [lanes(b) for b in i1.batches] == [["b"]]
    finish(scheduler, i0)
    assert [lanes(b) for b in i0.batches] == [["a"], ["-", "c"]]


def test_a_batch_waits_for_slot_utilization_or_the_delay() -> None:
    """``minimum_slot_utilization`` with ``max_queue_delay_microseconds``: the batch goes
    once enough slots have a request, or once its oldest request waited the delay."""
    scheduler, (i0,), clock = make(direct=DirectPolicy(max_queue_delay_us=1000,
                                                       minimum_slot_utilization=0.5))
    scheduler.enqueue(request("a1", 1, START, clock=clock))
    assert i0.batches == []
    clock.advance(500_000)
    scheduler.enqueue(request("b1", 2, START, clock=clock))
    assert [lanes(b) for b in i0.batches] == [["a1", "b1"]]  # 2 of 4 slots
    finish(scheduler, i0)
    scheduler.enqueue(request("a2", 1, clock=clock))
    assert len(i0.batches) == 1
    clock.advance(1_000_001)
    assert [lanes(b) for b in i0.batches[1:]] == [["a2"]]


def test_a_cancelled_queued_request_releases_its_sequence_and_lane() -> None:
    scheduler, (i0,), _ = make(max_batch_size=1)
    scheduler.enqueue(request("a1", 1, START))
    queued = request("a2", 1)
    scheduler.enqueue(queued)
    scheduler.enqueue(request("b1", 2, START))  # backlogged: one lane
    queued.cancellation.cancel(CancelReason.CLIENT_CANCELLED)
    scheduler.request_cancelled(queued)
    finish(scheduler, i0)
    assert [lanes(b) for b in i0.batches] == [["a1"], ["b1"]]
    assert "START" in refused(scheduler, request("a3", 1))


def test_a_request_of_batch_size_above_one_is_refused() -> None:
    scheduler, _, _ = make()
    big = request("a", 1, START)
    big.batch_size = 2
    with pytest.raises(Exception, match="must specify batch-size 1"):
        scheduler.enqueue(big)


def test_a_rescheduled_request_runs_again_in_its_lane() -> None:
    clock = ManualClock()
    policy = SchedulerPolicy(max_batch_size=2, sequence=SequencePolicy(iterative=True))
    scheduler = DirectSequenceScheduler("direct", 1, policy, clock=clock)
    i0 = FakeInstance("i0")
    scheduler.add_instances([i0])
    scheduler.enqueue(request("a", 1, START))
    scheduler.enqueue(request("b", 2, START))
    (a,) = i0.batches[-1]
    a.release_flags = RELEASE_RESCHEDULE
    finish(scheduler, i0)
    assert lanes(i0.batches[-1]) == ["a", "b"]  # a again, in lane 0, beside b
    finish(scheduler, i0)  # neither rescheduled: both sequences end
    assert scheduler.is_idle() and len(i0.batches) == 2


def test_a_request_of_another_shape_waits_and_its_slot_is_padded() -> None:
    """Triton's direct batcher with an input of variable size that is not ragged: a slot
    whose request's shape differs from the batch's first request gets padding this time."""
    clock = ManualClock()
    policy = SchedulerPolicy(max_batch_size=4, equal_shape_inputs=("IN",),
                             sequence=SequencePolicy(controls=CONTROLS))
    scheduler = DirectSequenceScheduler("direct", 1, policy, clock=clock)
    i0 = FakeInstance("i0")
    scheduler.add_instances([i0])
    scheduler.enqueue(request("hold", 9, START))
    scheduler.enqueue(request("a", 1, START, width=2))
    scheduler.enqueue(request("b", 2, START, width=3))
    scheduler.enqueue(request("c", 3, START, width=2))
    finish(scheduler, i0)
    assert lanes(i0.batches[-1]) == ["-", "a", "-", "c"]
    assert i0.batches[-1][0].request.inputs["IN"].shape == (1, 2)  # shaped as the first
    finish(scheduler, i0)
    assert lanes(i0.batches[-1]) == ["-", "-", "b"]



def test_a_backlogged_sequence_past_its_timeout_is_rejected() -> None:
    """Triton's sequence batcher: a sequence still in the backlog when the earliest timeout
    of its requests passes is released, its requests answered UNAVAILABLE (REJECTED); a
    sequence that has a lane is not bounded by it."""

    async def run() -> None:
        loop = asyncio.get_running_loop()
        scheduler, (i0,), clock = make(max_batch_size=1)

        def timed(name: str, correlation_id: int, flags: int, timeout_us: int
                  ) -> AdmittedRequest:
            decoded = request(name, correlation_id, flags).request
            decoded.timeout_us = timeout_us
            return admit(decoded, arrival_ns=clock.now_ns(), loop=loop)

        a1 = timed("a1", 1, START, 1000)
        scheduler.enqueue(a1)
        b1 = timed("b1", 2, START, 5000)
        scheduler.enqueue(b1)
        clock.advance(2_000_000)
        b2 = timed("b2", 2, 0, 1000)  # the earlier deadline: 3 ms from the start
        scheduler.enqueue(b2)
        clock.advance(999_000)
        assert not b1.stream.closed
        clock.advance(1000)
        for rejected in (b1, b2):
            response = rejected.stream.final_response
            assert response is not None and response.error is not None
            assert response.error.code is ErrorCode.UNAVAILABLE
            assert response.error.message == ("timeout of the corresponding sequence has "
                                              "been expired")
            scheduler.request_finished(rejected, response.error)  # as the service does
        assert scheduler.stats.failures["REJECTED"] == 2 and scheduler.stats.pending == 0
        assert not a1.stream.closed  # executing in its lane: the timeout bounds only waiting
        assert "must specify the START flag" in refused(scheduler, request("b3", 2, END))
        scheduler.enqueue(request("a2", 1, END))
        for _ in range(2):
            finish(scheduler, i0)
        scheduler.enqueue(request("c1", 3, START | END))  # the lane is free, nothing waits
        assert [lanes(b) for b in i0.batches] == [["a1"], ["a2"], ["c1"]]

    asyncio.run(run())
