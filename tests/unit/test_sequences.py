"""SequenceScheduler: correlation ids and flags, instance affinity, idle release, control
tensors, cancellation of a sequence's queued requests."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2

from tests.unit.admitted import admit
from tritium.core.cancellation import CancelReason
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.request import (
    SEQUENCE_END,
    SEQUENCE_START,
    AdmittedRequest,
    InferenceRequest,
    RequestStage,
)
from tritium.core.types import DataType
from tritium.scheduling.clock import ManualClock
from tritium.scheduling.policy import (
    ControlKind,
    SchedulerPolicy,
    SequenceControl,
    SequencePolicy,
)
from tritium.scheduling.sequence_direct import DirectSequenceScheduler
from tritium.scheduling.sequences import SequenceScheduler

MS = 1_000_000
START, END = SEQUENCE_START, SEQUENCE_END



class FakeInstance:
    def __init__(self, name: str):
        self.name = name
        self.batches: list[list[AdmittedRequest]] = []

    def submit(self, batch: list[AdmittedRequest]) -> None:
        self.batches.append(batch)

    def ids(self) -> list[str]:
        return [r.request.id for batch in self.batches for r in batch]


def make(instances: int = 2, idle_us: int = 1_000_000, max_batch_size: int = 0,
         controls: tuple[SequenceControl, ...] = ()
         ) -> tuple[SequenceScheduler, list[FakeInstance], ManualClock]:
    clock = ManualClock()
    policy = SchedulerPolicy(max_batch_size=max_batch_size,
                             sequence=SequencePolicy(max_idle_us=idle_us, controls=controls))
    scheduler = DirectSequenceScheduler("acc", 1, policy, clock=clock)
    pool = [FakeInstance(f"i{n}") for n in range(instances)]
    scheduler.add_instances(pool)
    return scheduler, pool, clock


def request(name: str, correlation_id: int | str, flags: int = 0) -> AdmittedRequest:
    r = InferenceRequest(model_name="acc", inputs={}, id=name,
                         correlation_id=correlation_id, flags=flags)
    return admit(r)


def finish(scheduler: SequenceScheduler, instance: FakeInstance) -> None:
    """The instance's last batch finished executing."""
    scheduler.batch_done(instance, instance.batches[-1], 1000)


def refused(scheduler: SequenceScheduler, r: AdmittedRequest) -> str:
    with pytest.raises(TritiumError) as caught:
        scheduler.enqueue(r)
    assert caught.value.code is ErrorCode.INVALID_ARG
    return caught.value.message


@pytest.mark.parametrize("correlation_id", [0, ""])
def test_a_correlation_id_is_required(correlation_id: int | str) -> None:
    scheduler, _, _ = make()
    message = refused(scheduler, request("a", correlation_id, START))
    assert message == ("inference request to model 'acc' must specify a non-zero or non-empty "
                       "correlation ID")
    assert scheduler.stats.pending == 0


def test_an_unknown_sequence_needs_start() -> None:
    scheduler, pool, _ = make()
    message = refused(scheduler, request("a", 7))
    assert "sequence 7" in message and "START" in message
    assert pool[0].batches == [] and scheduler.is_idle()


def test_sequences_keep_to_their_instance_one_request_at_a_time() -> None:
    scheduler, (i0, i1), _ = make()
    scheduler.enqueue(request("a1", 1, START))
    scheduler.enqueue(request("b1", "two", START))
    assert (i0.ids(), i1.ids()) == (["a1"], ["b1"])
    scheduler.enqueue(request("a2", 1))
    scheduler.enqueue(request("a3", 1, END))
    finish(scheduler, i1)
    scheduler.enqueue(request("b2", "two"))
    # a2 waits for a1 even though i1 is free; b2 runs on i1 at once.
    assert (i0.ids(), i1.ids()) == (["a1"], ["b1", "b2"])
    finish(scheduler, i0)
    assert i0.ids() == ["a1", "a2"]
    finish(scheduler, i0)
    finish(scheduler, i1)
    assert (i0.ids(), i1.ids()) == (["a1", "a2", "a3"], ["b1", "b2"])
    finish(scheduler, i0)
    assert scheduler.is_idle()


def test_a_new_sequence_takes_a_free_instance_or_waits_for_one() -> None:
    """Triton's direct strategy without batching: one sequence slot per instance; a new
    sequence that finds none free waits in the backlog until a sequence ends."""
    scheduler, (i0, i1), _ = make()
    for n, cid in enumerate((1, 2, 3)):
        scheduler.enqueue(request(f"s{n}", cid, START))
    assert (i0.ids(), i1.ids()) == (["s0"], ["s1"])
    scheduler.enqueue(request("end1", 2, END))
    finish(scheduler, i1)
    finish(scheduler, i1)  # end1 ran: its slot goes to the backlogged sequence
    assert (i0.ids(), i1.ids()) == (["s0"], ["s1", "end1", "s2"])


def test_end_releases_the_sequence() -> None:
    scheduler, (i0, _), _ = make()
    scheduler.enqueue(request("a1", 1, START | END))
    finish(scheduler, i0)
    refused(scheduler, request("a2", 1))
    scheduler.enqueue(request("again", 1, START))  # the id can start a new sequence
    assert i0.ids() == ["a1", "again"]


def test_start_on_an_active_sequence_restarts_it_on_the_same_instance() -> None:
    scheduler, (i0, i1), _ = make()
    scheduler.enqueue(request("a1", 1, START))
    scheduler.enqueue(request("b1", 2, START))
    finish(scheduler, i0)
    scheduler.enqueue(request("a-new", 1, START))
    scheduler.enqueue(request("c1", 3, START))  # both slots are held: c waits
    finish(scheduler, i0)
    assert i0.ids() == ["a1", "a-new"] and i1.ids() == ["b1"]
    scheduler.enqueue(request("a-end", 1, END))
    finish(scheduler, i0)
    assert i0.ids() == ["a1", "a-new", "a-end", "c1"]


def test_an_idle_sequence_is_released(caplog: pytest.LogCaptureFixture) -> None:
    scheduler, (i0, _), clock = make(idle_us=300_000)
    scheduler.enqueue(request("a1", 1, START))
    clock.advance(1000 * MS)  # executing: not idle, however long it takes
    finish(scheduler, i0)
    clock.advance(299 * MS)
    scheduler.enqueue(request("a2", 1))  # just in time: the idle time starts again
    finish(scheduler, i0)
    clock.advance(299 * MS)
    assert i0.ids() == ["a1", "a2"]
    with caplog.at_level(logging.INFO, logger="tritium.scheduler"):
        clock.advance(2 * MS)
    assert "sequence 1 for model 'acc' version 1 released: no request for 300000 us" \
        in caplog.text
    refused(scheduler, request("a3", 1))
    assert clock.pending() == 0


def test_idle_sequences_are_released_in_turn() -> None:
    scheduler, (i0, i1), clock = make(idle_us=300_000)
    scheduler.enqueue(request("a1", 1, START))
    finish(scheduler, i0)
    clock.advance(100 * MS)
    scheduler.enqueue(request("b1", 2, START))
    finish(scheduler, i1)
    clock.advance(250 * MS)
    refused(scheduler, request("a2", 1))
    scheduler.enqueue(request("b2", 2))
    clock.advance(100 * MS)
    finish(scheduler, i1)
    clock.advance(299 * MS)
    scheduler.enqueue(request("b3", 2, END))


def _controls() -> tuple[SequenceControl, ...]:
    return (
        SequenceControl("START", ControlKind.START, DataType.INT32, 0, 1),
        SequenceControl("END", ControlKind.END, DataType.FP32, 0.0, 5.0),
        SequenceControl("READY", ControlKind.READY, DataType.BOOL, False, True),
        SequenceControl("CORRID", ControlKind.CORRID, DataType.UINT64),
    )


@pytest.mark.parametrize(("max_batch_size", "shape"), [(0, (1,)), (4, (1, 1))])
def test_control_tensors_are_added(max_batch_size: int, shape: tuple[int, ...]) -> None:
    scheduler, (i0, _), _ = make(max_batch_size=max_batch_size, controls=_controls())
    first, last = request("a1", 42, START), request("a2", 42, END)
    scheduler.enqueue(first)
    scheduler.enqueue(last)
    seen = {}
    for r in (first.request, last.request):
        seen[r.id] = {name: t.data.reshape(-1)[0].item() for name, t in r.inputs.items()}
        assert {t.shape for t in r.inputs.values()} == {shape}
        assert {t.data.shape for t in r.inputs.values()} == {shape}
    assert seen["a1"] == {"START": 1, "END": 0.0, "READY": True, "CORRID": 42}
    assert seen["a2"] == {"START": 0, "END": 5.0, "READY": True, "CORRID": 42}
    assert last.request.inputs["CORRID"].data.dtype == np.uint64
    assert i0.ids() == ["a1"]


def test_string_correlation_id_control() -> None:
    control = SequenceControl("CORRID", ControlKind.CORRID, DataType.BYTES)
    scheduler, _, _ = make(controls=(control,))
    r = request("a1", "user-7", START)
    scheduler.enqueue(r)
    assert r.request.inputs["CORRID"].data.tolist() == [b"user-7"]
    numeric = SequenceControl("CORRID", ControlKind.CORRID, DataType.INT32)
    scheduler, _, _ = make(controls=(numeric,))
    assert "numeric correlation ID" in refused(scheduler, request("a1", "user-7", START))
    assert "does not fit" in refused(scheduler, request("a1", 1 << 40, START))


def test_cancelling_a_queued_request_cancels_the_rest_of_its_sequence() -> None:
    scheduler, (i0, i1), _ = make()
    running = request("a1", 1, START)
    a2, a3, a4 = request("a2", 1), request("a3", 1), request("a4", 1)
    other = request("b1", 2, START)
    for r in (running, other, a2, a3, a4):
        scheduler.enqueue(r)
    b2 = request("b2", 2)
    i1.batches.clear()
    scheduler.batch_done(i1, [other], 1000)
    scheduler.enqueue(b2)
    a3.cancellation.cancel(CancelReason.CLIENT_CANCELLED)
    scheduler.request_cancelled(a3)
    assert [r.cancellation.reason for r in (a2, a4)] == [CancelReason.CLIENT_CANCELLED] * 2
    assert not running.cancellation.is_cancelled() and running.stage is RequestStage.EXECUTING
    assert all(r.stage is RequestStage.DONE for r in (a2, a3, a4))
    assert scheduler.stats.cancellations[("CLIENT_CANCELLED", "queued")] == 3
    for r in (a2, a4):  # as the service's callbacks would: nothing left to do
        scheduler.request_cancelled(r)
    assert scheduler.stats.cancellations[("CLIENT_CANCELLED", "queued")] == 3
    assert scheduler.stats.pending == 0
    finish(scheduler, i0)
    assert i0.ids() == ["a1"]
    assert i1.ids() == ["b2"]  # the other sequence goes on
    refused(scheduler, request("a5", 1))  # released


def test_a_request_cancelled_on_another_thread_is_caught_at_dispatch() -> None:
    scheduler, (i0,), _ = make(instances=1)
    scheduler.enqueue(request("a1", 1, START))
    a2, a3 = request("a2", 1), request("a3", 1)
    scheduler.enqueue(a2)
    scheduler.enqueue(a3)
    a2.cancellation.cancel(CancelReason.DEADLINE)  # no request_cancelled yet
    finish(scheduler, i0)
    assert i0.ids() == ["a1"]
    assert a3.cancellation.reason is CancelReason.DEADLINE
    assert scheduler.is_idle()


def test_cancelling_an_executing_request_keeps_the_sequence() -> None:
    scheduler, (i0, _), _ = make()
    a1 = request("a1", 1, START)
    scheduler.enqueue(a1)
    a1.cancellation.cancel(CancelReason.CLIENT_DISCONNECTED)
    scheduler.request_cancelled(a1)
    assert scheduler.stats.cancellations[("CLIENT_DISCONNECTED", "executing")] == 1
    finish(scheduler, i0)
    scheduler.enqueue(request("a2", 1))
    assert i0.ids() == ["a1", "a2"]


def test_requests_are_refused_once_stopped() -> None:
    scheduler, _, _ = make()
    scheduler.stop_accepting()
    with pytest.raises(TritiumError) as caught:
        scheduler.enqueue(request("a1", 1, START))
    assert caught.value.code is ErrorCode.UNAVAILABLE


def _config(text: str) -> model_config_pb2.ModelConfig:
    from google.protobuf import text_format

    return text_format.Parse(text, model_config_pb2.ModelConfig())


def test_policy_from_config() -> None:
    config = _config("""
        name: "acc" max_batch_size: 2
        sequence_batching {
          max_sequence_idle_microseconds: 5000
          control_input [
            { name: "S" control [{ kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] }] },
            { name: "E" control [{ kind: CONTROL_SEQUENCE_END fp32_false_true: [0, 2] }] },
            { name: "R" control [{ kind: CONTROL_SEQUENCE_READY bool_false_true: [false, true] }] },
            { name: "C" control [{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING }] }
          ]
        }""")
    policy = SchedulerPolicy.from_config(config)
    assert policy.max_batch_size == 2 and not policy.dynamic_batching
    assert policy.sequence == SequencePolicy(5000, (
        SequenceControl("S", ControlKind.START, DataType.INT32, 0, 1),
        SequenceControl("E", ControlKind.END, DataType.FP32, 0.0, 2.0),
        SequenceControl("R", ControlKind.READY, DataType.BOOL, False, True),
        SequenceControl("C", ControlKind.CORRID, DataType.BYTES),
    ))
    assert SchedulerPolicy.from_config(_config('name: "m"')).sequence is None


@pytest.mark.parametrize(("control", "error"), [
    ("kind: CONTROL_SEQUENCE_START", "exactly one of int32_false_true"),
    ("kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] fp32_false_true: [0, 1]",
     "exactly one of"),
    ("kind: CONTROL_SEQUENCE_END int32_false_true: [1]", "two values"),
    ("kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32", "TYPE_UINT64"),
])
def test_invalid_controls_are_refused(control: str, error: str) -> None:
    config = _config(f'name: "acc" sequence_batching {{ control_input [{{ name: "X" '
                     f'control [{{ {control} }}] }}] }}')
    with pytest.raises(TritiumError) as caught:
        SchedulerPolicy.from_config(config)
    assert caught.value.code is ErrorCode.INVALID_ARG and error in caught.value.message
    assert "control input 'X' of model 'acc'" in caught.value.message
