"""SequenceScheduler with ``iterative_sequence``: own correlation ids, rescheduled requests,
and the implicit state inputs a python model gets."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tests.unit.admitted import admit
from tests.unit.test_sequences import FakeInstance, finish, request
from tritium.core.cancellation import CancelReason
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.request import (
    RELEASE_RESCHEDULE,
    SEQUENCE_END,
    SEQUENCE_START,
    InferenceRequest,
    RequestStage,
)
from tritium.core.types import DataType
from tritium.scheduling.clock import ManualClock
from tritium.scheduling.implicit_state import implicit_states
from tritium.scheduling.policy import (
    ControlKind,
    SchedulerPolicy,
    SequenceControl,
    SequencePolicy,
)
from tritium.scheduling.sequence_direct import DirectSequenceScheduler
from tritium.scheduling.sequences import SequenceScheduler

START_CONTROL = SequenceControl("START", ControlKind.START, DataType.INT32)


def make(instances: int = 1, iterative: bool = True, states: tuple = (),
         decoupled: bool = False) -> tuple[SequenceScheduler, list[FakeInstance]]:
    policy = SchedulerPolicy(sequence=SequencePolicy(
        controls=(START_CONTROL,), iterative=iterative, states=states))
    scheduler = DirectSequenceScheduler("it", 1, policy, decoupled, clock=ManualClock())
    pool = [FakeInstance(f"i{n}") for n in range(instances)]
    scheduler.add_instances(pool)
    return scheduler, pool


def test_a_request_without_correlation_id_starts_a_sequence_of_its_own() -> None:
    """Triton's IterativeSequencer::SetupSequenceRequest: a request whose correlation id is
    0 or empty is given the next id of a counter that starts at 1, and the START flag."""
    scheduler, (i0,) = make()
    a, b = request("a", 0), request("b", "")
    scheduler.enqueue(a)
    scheduler.enqueue(b)
    assert (a.request.correlation_id, a.request.flags) == (1, SEQUENCE_START)
    assert (b.request.correlation_id, b.request.flags) == (2, SEQUENCE_START)
    assert int(a.request.inputs["START"].data.reshape(-1)[0]) == 1
    assert i0.ids() == ["a"]


def test_without_iterative_a_correlation_id_is_still_required() -> None:
    scheduler, _ = make(iterative=False)
    with pytest.raises(TritiumError, match="must specify a non-zero or non-empty"):
        scheduler.enqueue(request("a", 0))


def test_a_rescheduled_request_runs_again_in_its_slot_without_start_or_end() -> None:
    """IterativeSequencer::RescheduleRequest: a request released with RESCHEDULE has its
    flags set to neither START nor END and is enqueued again, into its sequence's slot; a
    request of another sequence waits for a free slot (one per instance here)."""
    scheduler, (i0,) = make()
    a, b = request("a", 0), request("b", 0)
    scheduler.enqueue(a)
    scheduler.enqueue(b)
    a.release_flags = RELEASE_RESCHEDULE
    finish(scheduler, i0)
    assert a.stage is RequestStage.EXECUTING and a.release_flags == 1
    assert (a.request.flags, int(a.request.inputs["START"].data.reshape(-1)[0])) == (0, 0)
    assert i0.ids() == ["a", "a"]
    finish(scheduler, i0)  # not rescheduled: a's sequence ends and b gets the slot
    assert i0.ids() == ["a", "a", "b"]
    assert scheduler.stats.pending == 0 and a.stage is RequestStage.DONE
    finish(scheduler, i0)
    assert scheduler.is_idle()


def test_the_execution_that_does_not_reschedule_ends_the_sequence() -> None:
    """Released with ALL, an iterative request's sequence is ended (Triton enqueues a
    cancelled END marker for it): its correlation id needs START again."""
    scheduler, (i0,) = make()
    scheduler.enqueue(request("a1", 5, SEQUENCE_START))
    finish(scheduler, i0)
    with pytest.raises(TritiumError, match="must specify the START flag"):
        scheduler.enqueue(request("a2", 5))


def test_a_rescheduled_decoupled_request_stays_open_until_its_final() -> None:
    scheduler, (i0,) = make(decoupled=True)
    a = request("a", 0)
    scheduler.enqueue(a)
    a.release_flags = RELEASE_RESCHEDULE
    finish(scheduler, i0)
    assert i0.ids() == ["a", "a"] and a.stage is RequestStage.EXECUTING
    finish(scheduler, i0)
    assert i0.ids() == ["a", "a"] and scheduler.stats.executing == 0


def test_a_request_whose_client_left_is_not_rescheduled() -> None:
    scheduler, (i0,) = make()
    a = request("a", 0)
    scheduler.enqueue(a)
    a.release_flags = RELEASE_RESCHEDULE
    a.stream.closed = True  # ended: nobody waits for another execution
    finish(scheduler, i0)
    assert i0.ids() == ["a"] and a.stage is RequestStage.DONE and scheduler.is_idle()


def test_a_rescheduled_request_cancelled_while_executing_ends_cancelled() -> None:
    """Not run again, and answered: no later execution would send its response."""
    scheduler, (i0,) = make()
    loop = asyncio.new_event_loop()  # open: the stream's end is handed to it
    try:
        a = admit(InferenceRequest(model_name="it", inputs={}, id="a"), loop=loop)
        scheduler.enqueue(a)
        a.release_flags = RELEASE_RESCHEDULE
        a.cancellation.cancel(CancelReason.CLIENT_CANCELLED)
        finish(scheduler, i0)
        assert i0.ids() == ["a"] and a.stage is RequestStage.DONE and a.stream.closed
        assert a.stream.error is not None and a.stream.error.code is ErrorCode.CANCELLED
    finally:
        loop.close()


def test_without_iterative_the_release_flags_are_not_read() -> None:
    scheduler, (i0,) = make(iterative=False)
    a = request("a", 3, SEQUENCE_START | SEQUENCE_END)
    scheduler.enqueue(a)
    a.release_flags = RELEASE_RESCHEDULE  # the backend refuses it (tested end to end)
    finish(scheduler, i0)
    assert i0.ids() == ["a"] and a.stage is RequestStage.DONE


# -- implicit state ----------------------------------------------------------------------
def states(text: str, max_batch_size: int = 0, model_dir: Path | None = None) -> tuple:
    message = model_config_pb2.ModelSequenceBatching()
    text_format.Parse(text, message)
    return implicit_states(message, max_batch_size, model_dir)


def test_state_without_initial_state_is_zeros_with_variable_dims_as_one() -> None:
    """Triton's SequenceStates::Initialize: a variable dimension is 1 for the starting
    request, and a batching model's state has the batch dimension 1 in front."""
    (state,) = states('state [{ input_name: "IN_S" output_name: "OUT_S" '
                      "data_type: TYPE_INT32 dims: [-1, 3] }]", max_batch_size=4)
    tensor = state.tensor()
    assert (tensor.name, tensor.shape, tensor.datatype) == ("IN_S", (1, 1, 3), DataType.INT32)
    assert tensor.data.tolist() == [[[0, 0, 0]]] and tensor.data.flags.writeable


def test_initial_state_from_a_file_is_read_in_row_major_order(tmp_path: Path) -> None:
    """Triton reads ``<model dir>/initial_state/<data_file>`` as the raw, row-major bytes
    of the initial state."""
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "s.bin").write_bytes(
        np.arange(6, dtype=np.float32).tobytes())
    (state,) = states('state [{ input_name: "IN_S" output_name: "OUT_S" data_type: TYPE_FP32 '
                      'dims: [-1] initial_state { data_type: TYPE_FP32 dims: [6] '
                      'data_file: "s.bin" name: "from file" } }]', model_dir=tmp_path)
    assert state.tensor().data.tolist() == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize(("initial", "message"), [
    ("data_type: TYPE_INT32 dims: [2] zero_data: true name: \"x\"",
     "The data type used for 'initial_state' field of state 'IN_S' does not match the state "
     "data type."),
    ("data_type: TYPE_FP32 dims: [2] zero_data: true",
     "Field 'name' must be set when using initial_state for state input 'IN_S'."),
    ("data_type: TYPE_FP32 dims: [2, 1] zero_data: true name: \"x\"",
     "Number of dimensions in 'initial_state' doesn't match the size of 'state' dimensions "
     "for state input 'IN_S'. 2 != 1"),
    ("data_type: TYPE_FP32 dims: [-1] zero_data: true name: \"x\"",
     "'initial_state' field for state input name 'IN_S' contains variable dimensions."),
    ("data_type: TYPE_FP32 dims: [3] zero_data: true name: \"x\"",
     "'initial_state' dim for input name 'IN_S' doesn't match 'state' dim description. "
     "3 != 2"),
    ("data_type: TYPE_FP32 dims: [2] name: \"x\"",
     "initial_state setting expects state'IN_S' to have state_data set"),
])
def test_initial_state_checks_use_triton_texts(initial: str, message: str) -> None:
    """Triton's SequenceBatchScheduler::GenerateInitialStateData refuses these, in these
    words, and the model fails to load."""
    with pytest.raises(TritiumError) as caught:
        states('state [{ input_name: "IN_S" output_name: "OUT_S" data_type: TYPE_FP32 '
               f"dims: [2] initial_state {{ {initial} }} }}]")
    assert caught.value.message == message


def test_a_short_initial_state_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "s.bin").write_bytes(b"\0" * 4)
    with pytest.raises(TritiumError) as caught:
        states('state [{ input_name: "IN_S" output_name: "OUT_S" data_type: TYPE_FP32 '
               'dims: [2] initial_state { data_type: TYPE_FP32 dims: [2] data_file: "s.bin" '
               'name: "x" } }]', model_dir=tmp_path)
    assert caught.value.message == ("initial_state setting expects 8 bytes, but the data "
                                    "provided from s.binonly has 4 bytes.")


def test_every_request_of_a_sequence_gets_the_initial_state() -> None:
    """A python model in Triton sees the initial state on every request: only
    TRITONBACKEND_StateUpdate makes an output state the next input, and the python backend
    never calls it."""
    initial = states('state [{ input_name: "IN_S" output_name: "OUT_S" data_type: TYPE_INT32 '
                     'dims: [1] initial_state { data_type: TYPE_INT32 dims: [1] zero_data: '
                     'true name: "zero" } }]')
    scheduler, (i0,) = make(iterative=False, states=initial)
    first, second = request("a1", 9, SEQUENCE_START), request("a2", 9, SEQUENCE_END)
    scheduler.enqueue(first)
    first.request.inputs["IN_S"].data[0] = 41  # the model writes to its own copy
    finish(scheduler, i0)
    scheduler.enqueue(second)
    assert second.request.inputs["IN_S"].data.tolist() == [0]
