"""Sequence scheduler, direct strategy (Triton's default): one batch slot per sequence.

As Triton's DirectSequenceBatch: each instance has ``max_batch_size`` slots, or one for a
model that does not batch (here *lanes*, to keep apart from ``sequences._Slot``, which is
an instance). A new sequence takes the free lane with the lowest index over all instances
and keeps it until its END request has run (or it is released idle or cancelled); with no
lane free it waits in the backlog, its requests queued, and takes the first lane that
frees, oldest sequence first.

A batch holds, for lanes 0 to the highest lane with a queued request, that lane's oldest
request, or where a lane has none a padding request: a copy of the batch's first real
request with zeroed inputs, READY, START and END false, CORRID 0 (empty for a string id)
and no requested output. So a model that keeps state per batch index finds each sequence
at the same index in every execute. What a model answers to padding is dropped, and
statistics count only the real requests.

With both ``max_queue_delay_microseconds`` and ``minimum_slot_utilization`` set, a batch
waits until the share of lanes with a request reaches the utilization or its oldest
request has waited the delay.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import numpy as np

from tritium.core.cancellation import Cancellation
from tritium.core.errors import invalid
from tritium.core.request import AdmittedRequest, InferenceRequest, RequestStage
from tritium.core.response import ResponseStream
from tritium.core.types import DataType, Tensor
from tritium.scheduling.batcher import EqualInputs
from tritium.scheduling.clock import Clock
from tritium.scheduling.implicit_state import zeros
from tritium.scheduling.policy import ControlKind, SchedulerPolicy, SequenceControl
from tritium.scheduling.scheduler import Instance, ModelScheduler
from tritium.scheduling.sequences import SequenceScheduler, _Sequence, _Slot

_QUEUED = RequestStage.QUEUED


class _Lane:
    """One batch index of an instance and the queued requests of its sequence."""

    __slots__ = ("holders", "index", "queue")

    def __init__(self, index: int):
        self.index = index
        # Requests in arrival order; one that left the queue otherwise (cancelled) stays
        # here until passed over.
        self.queue: collections.deque[AdmittedRequest] = collections.deque()
        # Sequences bound here that have not settled: the one it serves and, after a
        # START that restarts it, the ended one whose requests still run first.
        self.holders = 0


class _LaneSlot(_Slot):
    """An instance, its lanes, and the real requests of the batch it executes."""

    __slots__ = ("busy", "executing", "lanes")

    def __init__(self, instance: Instance, lanes: int):
        super().__init__(instance)
        self.lanes = [_Lane(index) for index in range(lanes)]
        self.executing: dict[AdmittedRequest, _Sequence] = {}
        self.busy = False


class _Backlog:
    """The instance of the backlog's slot: it never executes anything."""

    name = "backlog"

    def submit(self, batch: list[AdmittedRequest]) -> None:
        raise AssertionError("a backlogged sequence was dispatched")


class _Padded:
    """Hands an instance the batch with its padding, in lane order, where the base class
    counts and submits only the real requests."""

    __slots__ = ("_batch", "_instance", "name")

    def __init__(self, instance: Instance, batch: list[AdmittedRequest]):
        self._instance = instance
        self._batch = batch
        self.name = instance.name

    def submit(self, batch: list[AdmittedRequest]) -> None:
        self._instance.submit(self._batch)


class DirectSequenceScheduler(SequenceScheduler):
    """``SequenceScheduler`` with the direct strategy's batch slots."""

    def __init__(self, model_name: str, version: int, policy: SchedulerPolicy,
                 decoupled: bool = False, clock: Clock | None = None):
        super().__init__(model_name, version, policy, decoupled, clock)
        assert policy.sequence is not None
        direct = policy.sequence.direct
        self._lane_count = max(1, policy.max_batch_size)
        self._utilization = direct.minimum_slot_utilization
        # As Triton: without both settings a batch goes as soon as its instance is free.
        self._delay_ns = direct.max_queue_delay_us * 1000 if self._utilization else 0
        self._lane_of: dict[_Sequence, _Lane] = {}
        self._backlog_slot = _LaneSlot(_Backlog(), 0)
        self._added = ({control.name for control in self._controls}
                       | {state.input_name for state in self._states})
        self._padding_controls = [(control, _padding_value(control))
                                  for control in self._controls]
        self._equal_inputs = EqualInputs.of(policy)

    # -- instances ---------------------------------------------------------------
    def add_instances(self, instances: Sequence[Instance]) -> None:
        for instance in instances:
            self._slots[instance] = _LaneSlot(instance, self._lane_count)
        self._promote()
        self._dispatch()

    def batch_done(self, instance: Instance, batch: list[AdmittedRequest], exec_ns: int,
                   woken: list[ResponseStream] | None = None) -> None:
        slot = self._lane_slot(instance)
        executing, slot.executing = slot.executing, {}
        slot.busy = False
        real = [request for request in batch if request in executing]
        for request in real:
            self._executed(request, executing[request])  # may queue it again (rescheduled)
        # Counts the real requests, then calls ``_dispatch``.
        ModelScheduler.batch_done(self, instance, real, exec_ns, woken)

    def _dispatch(self) -> None:
        self._idle.clear()  # the slots know which instances are busy
        for slot in self._slots.values():
            self._run(self._as_lane_slot(slot))

    # -- requests ----------------------------------------------------------------
    def enqueue(self, request: AdmittedRequest) -> None:
        if request.batch_size > 1:
            raise invalid(f"inference request to model '{self.model_name}' must specify "
                          "batch-size 1 due to requirements of sequence batcher")
        super().enqueue(request)

    # -- hooks of SequenceScheduler ----------------------------------------------
    def _arrived(self, request: AdmittedRequest, sequence: _Sequence) -> None:
        lane = self._lane_of.get(sequence)
        if lane is not None:  # a backlogged sequence's requests wait in ``waiting``
            lane.queue.append(request)
            self._run(self._as_lane_slot(sequence.slot))

    def _requeued(self, request: AdmittedRequest, sequence: _Sequence) -> None:
        """A rescheduled request goes behind its lane's queue; ``batch_done`` dispatches."""
        self._lane_of[sequence].queue.append(request)

    def _sequence_for(self, request: AdmittedRequest) -> _Sequence:
        previous = self._active.get(request.request.correlation_id)
        lane = None if previous is None else self._lane_of.get(previous)
        if lane is not None:
            # Held for a START that restarts the sequence: releasing the previous one
            # must not hand its lane to the backlog.
            lane.holders += 1
        sequence = super()._sequence_for(request)  # raises only when there is no previous
        if sequence is previous:
            if lane is not None:
                lane.holders -= 1
            return sequence
        if lane is not None:
            # A restarted sequence goes on in its lane, after the ended one's requests.
            self._lane_of[sequence] = lane
        elif sequence.slot is self._backlog_slot:
            self._backlog[sequence] = None
        else:
            free = self._free_lane(self._as_lane_slot(sequence.slot))
            assert free is not None  # ``_least_loaded_slot`` chose the slot for it
            self._hold(sequence, free)
        return sequence

    def _least_loaded_slot(self) -> _Slot:
        super()._least_loaded_slot()  # raises when there is no instance
        if self._backlog:
            return self._backlog_slot  # behind the sequences already waiting
        found = self._lowest_free_lane()
        return self._backlog_slot if found is None else found[0]

    def _release(self, sequence: _Sequence) -> None:
        if sequence.released:
            return
        super()._release(sequence)
        self._settle(sequence)

    # -- lanes -------------------------------------------------------------------
    def _hold(self, sequence: _Sequence, lane: _Lane) -> None:
        self._lane_of[sequence] = lane
        lane.holders += 1

    def _settle(self, sequence: _Sequence) -> None:
        """A released sequence with nothing queued or executing gives its lane back (as
        Triton frees a slot once its END request has been batched) or leaves the backlog."""
        if not sequence.released or sequence.outstanding:
            return
        if self._backlog.pop(sequence, None) is not None:
            return
        lane = self._lane_of.pop(sequence, None)
        if lane is not None:
            lane.holders -= 1
            if lane.holders == 0:
                self._promote()

    def _lowest_free_lane(self) -> tuple[_LaneSlot, _Lane] | None:
        """Triton's choice for a new sequence: the free lane with the lowest index, on the
        first instance that has it."""
        found: tuple[_LaneSlot, _Lane] | None = None
        for slot in self._slots.values():
            lane = self._free_lane(self._as_lane_slot(slot))
            if lane is not None and (found is None or lane.index < found[1].index):
                found = (self._as_lane_slot(slot), lane)
        return found

    @staticmethod
    def _free_lane(slot: _LaneSlot) -> _Lane | None:
        return next((lane for lane in slot.lanes if lane.holders == 0), None)

    def _promote(self) -> None:
        """Give free lanes to backlogged sequences, oldest first; the caller dispatches."""
        while self._backlog:
            found = self._lowest_free_lane()
            if found is None:
                return
            slot, lane = found
            sequence = next(iter(self._backlog))
            del self._backlog[sequence]
            if not sequence.released:
                self._backlog_slot.sequences -= 1
                slot.sequences += 1
            sequence.slot = slot
            self._hold(sequence, lane)
            lane.queue.extend(sequence.waiting)

    # -- batches -----------------------------------------------------------------
    def _run(self, slot: _LaneSlot) -> None:
        """Start a batch on the slot's instance if it is free and the delay rule allows."""
        if slot.busy:
            return
        fronts = [self._front(lane) for lane in slot.lanes]
        ready = [request for request in fronts if request is not None]
        if not ready or self._must_wait(ready):
            return
        last = max(index for index, request in enumerate(fronts) if request is not None)
        if self._equal_inputs is not None:
            # As Triton: a request that does not fit the batch's first waits, its lane padded.
            fronts = self._fitting(fronts, ready[0])
            ready = [request for request in fronts if request is not None]
        batch: list[AdmittedRequest] = []
        for lane, request in zip(slot.lanes[:last + 1], fronts, strict=False):
            if request is None:
                batch.append(self._padding(ready[0]))
                continue
            lane.queue.popleft()
            sequence = self._queued.pop(request)
            del sequence.waiting[request]
            slot.executing[request] = sequence
            batch.append(request)
        slot.busy = True
        self._start(ready, _Padded(slot.instance, batch))

    def _must_wait(self, ready: list[AdmittedRequest]) -> bool:
        if not self._delay_ns or len(ready) / self._lane_count >= self._utilization:
            return False
        due_ns = min(request.arrival_ns for request in ready) + self._delay_ns
        if self._clock.now_ns() > due_ns:
            return False
        self._window.arm(due_ns + 1)
        return True

    def _fitting(self, fronts: list[AdmittedRequest | None], first: AdmittedRequest
                 ) -> list[AdmittedRequest | None]:
        assert self._equal_inputs is not None
        fits, inputs = self._equal_inputs.fits, first.request.inputs
        return [request if request is None or fits(inputs, request.request.inputs) else None
                for request in fronts]

    def _front(self, lane: _Lane) -> AdmittedRequest | None:
        """The lane's oldest live request; drops those that left the queue."""
        queue = lane.queue
        while queue:
            request = queue[0]
            sequence = self._queued.get(request)
            if sequence is None:
                queue.popleft()  # cancelled while queued
            elif request.stage is not _QUEUED:
                # Rescheduled, then ended by a FINAL its model sent from elsewhere.
                queue.popleft()
                self._drop_ended(request, sequence)
            elif request.cancellation.reason is not None:
                # Cancelled on another thread; its callback has not reached us yet. What
                # it frees is dispatched from the loop, not from inside this batch.
                self._forget_cancelled(request)
                self._window.arm(self._clock.now_ns())
            else:
                return request
        return None

    def _padding(self, like: AdmittedRequest) -> AdmittedRequest:
        """A padding request shaped as ``like``; its responses go to a stream nobody reads."""
        source = like.request
        inputs = {name: Tensor(name, tensor.datatype, tensor.shape,
                               zeros(tensor.datatype, tensor.shape))
                  for name, tensor in source.inputs.items() if name not in self._added}
        shape = self._control_shape
        for control, value in self._padding_controls:
            inputs[control.name] = Tensor(control.name, control.datatype, shape,
                                          value.reshape(shape).copy())
        for state in self._states:
            inputs[state.input_name] = state.tensor()
        request = InferenceRequest(source.model_name, inputs, source.model_version,
                                   requested_outputs=[])
        loop = like.cancellation.loop
        padding = AdmittedRequest(request, Cancellation(loop), ResponseStream(loop),
                                  like.batch_size)
        padding.move_to(_QUEUED)
        padding.move_to(RequestStage.EXECUTING)
        return padding

    def _lane_slot(self, instance: Instance) -> _LaneSlot:
        return self._as_lane_slot(self._slots[instance])

    @staticmethod
    def _as_lane_slot(slot: _Slot) -> _LaneSlot:
        assert isinstance(slot, _LaneSlot)
        return slot


def _padding_value(control: SequenceControl) -> np.ndarray:
    """A padding request's control value: every flag false, correlation id 0."""
    if control.kind is not ControlKind.CORRID:
        return np.array([control.false_value], dtype=control.datatype.numpy)
    if control.datatype is DataType.BYTES:
        return np.array([b""], dtype=np.object_)
    return np.array([0], dtype=control.datatype.numpy)
