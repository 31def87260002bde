"""Sequence scheduler, oldest strategy: requests of several sequences batched together.

As Triton's OldestSequenceBatch: every request of a sequence runs on the instance its
first request was bound to, one at a time and in order; each sequence has at most one
request issued to that instance's dynamic batcher, which forms batches of up to
``max_batch_size`` requests from different sequences, oldest first, following the
``oldest`` block's ``preferred_batch_size`` and ``max_queue_delay_microseconds``.

An instance holds at most ``max_candidate_sequences`` sequences (default: ``max_batch_size``,
at least 1). A new sequence that finds no instance with room waits in the backlog, its
requests queued, until a sequence ends (END, idle release or cancellation) and its last
request has finished, and then takes its place. ``preserve_ordering`` delivers the responses
``execute`` returns in the order the batches were dispatched, as the dynamic batcher's does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tritium.core.request import AdmittedRequest, RequestStage
from tritium.core.response import ResponseStream
from tritium.scheduling.batcher import Batcher
from tritium.scheduling.clock import Clock
from tritium.scheduling.ordering import OrderedDelivery
from tritium.scheduling.policy import SchedulerPolicy
from tritium.scheduling.scheduler import Instance, ModelScheduler
from tritium.scheduling.sequences import SequenceScheduler, _Sequence, _Slot


class _BatchSlot(_Slot):
    """An instance, the requests issued to its batcher and those it executes."""

    __slots__ = ("busy", "ending", "executing", "ready")

    def __init__(self, instance: Instance):
        super().__init__(instance)
        # One request per sequence, in the order they were issued (oldest first).
        self.ready: dict[AdmittedRequest, _Sequence] = {}
        self.executing: dict[AdmittedRequest, _Sequence] = {}
        self.busy = False
        self.ending = 0  # released sequences whose last requests have not finished


class _Backlog:
    """The instance of the backlog's slot: it never executes anything."""

    name = "backlog"

    def submit(self, batch: list[AdmittedRequest]) -> None:
        raise AssertionError("a backlogged sequence was dispatched")


class OldestSequenceScheduler(SequenceScheduler):
    """``SequenceScheduler`` with the ``oldest`` strategy."""

    def __init__(self, model_name: str, version: int, policy: SchedulerPolicy,
                 decoupled: bool = False, clock: Clock | None = None):
        super().__init__(model_name, version, policy, decoupled, clock)
        assert policy.sequence is not None and policy.sequence.oldest is not None
        oldest = policy.sequence.oldest
        self._sequence_batcher = Batcher(dataclasses.replace(
            policy, dynamic_batching=True, preferred_batch_sizes=oldest.preferred_batch_sizes,
            max_queue_delay_us=oldest.max_queue_delay_us))
        self._capacity = oldest.max_candidate_sequences or max(1, policy.max_batch_size)
        if oldest.preserve_ordering:
            # The base class holds a batch's returned responses until those before it left.
            self._ordered = OrderedDelivery()
        # Sequences waiting for room on an instance, oldest first, bound to this slot.
        self._backlog_slot = _BatchSlot(_Backlog())
        self._ending: dict[_Sequence, None] = {}  # see _BatchSlot.ending

    # -- instances ---------------------------------------------------------------
    def add_instances(self, instances: Sequence[Instance]) -> None:
        for instance in instances:
            self._slots[instance] = _BatchSlot(instance)
        self._dispatch()

    def batch_done(self, instance: Instance, batch: list[AdmittedRequest], exec_ns: int,
                   woken: list[ResponseStream] | None = None) -> None:
        slot = self._batch_slot(instance)
        executing, slot.executing = slot.executing, {}
        slot.busy = False
        for request in batch:
            sequence = executing.get(request)
            if sequence is not None:
                self._executed(request, sequence)  # may queue it again (rescheduled)
                sequence.in_flight = False
                self._issue(sequence)
        # Counts the batch, then calls ``_dispatch``.
        ModelScheduler.batch_done(self, instance, batch, exec_ns, woken)

    def _dispatch(self) -> None:
        self._idle.clear()  # the slots know which instances are busy
        for slot in self._slots.values():
            self._run(self._as_batch_slot(slot))

    # -- hooks of SequenceScheduler ----------------------------------------------
    def _arrived(self, request: AdmittedRequest, sequence: _Sequence) -> None:
        if not sequence.in_flight:
            self._issue(sequence)
            self._dispatch()  # an END may have let a backlogged sequence in elsewhere

    def _sequence_for(self, request: AdmittedRequest) -> _Sequence:
        sequence = super()._sequence_for(request)
        if sequence.slot is self._backlog_slot and sequence not in self._backlog:
            self._backlog[sequence] = None
        return sequence

    def _least_loaded_slot(self) -> _Slot:
        if self._backlog:
            return self._backlog_slot  # behind the sequences already waiting
        super()._least_loaded_slot()  # raises when there is no instance
        return self._slot_with_room() or self._backlog_slot

    def _slot_with_room(self) -> _BatchSlot | None:
        """The instance holding the fewest sequences, if it has room for another."""
        slots = [self._as_batch_slot(slot) for slot in self._slots.values()]
        slot = min(slots, key=lambda s: s.sequences + s.ending, default=None)
        if slot is None or slot.sequences + slot.ending >= self._capacity:
            return None
        return slot

    def _release(self, sequence: _Sequence) -> None:
        if sequence.released:
            return
        super()._release(sequence)
        if sequence in self._backlog:
            # Its queued requests (an END among them) still run once it gets room.
            self._settle(sequence)
            return
        if sequence.outstanding:
            self._hold_ending(sequence)
            return
        self._promote()

    def _hold_ending(self, sequence: _Sequence) -> None:
        """As Triton frees a sequence slot only once its END request has completed."""
        self._as_batch_slot(sequence.slot).ending += 1
        self._ending[sequence] = None

    def _settle(self, sequence: _Sequence) -> None:
        """``sequence`` has one request fewer outstanding: a released one that has none
        left makes room."""
        if sequence.outstanding:
            return
        if sequence.released and self._backlog.pop(sequence, None) is not None:
            return  # released in the backlog with nothing left to run
        if sequence in self._ending:
            del self._ending[sequence]
            self._as_batch_slot(sequence.slot).ending -= 1
            self._promote()

    def _promote(self) -> None:
        """Bind backlogged sequences to instances with room, oldest first; the caller
        dispatches."""
        while self._backlog:
            slot = self._slot_with_room()
            if slot is None:
                return
            sequence = next(iter(self._backlog))
            del self._backlog[sequence]
            sequence.slot = slot
            if sequence.released:  # its END is queued: it holds the room until that ran
                self._hold_ending(sequence)
            else:
                self._backlog_slot.sequences -= 1
                slot.sequences += 1
            self._issue(sequence)

    def _requeued(self, request: AdmittedRequest, sequence: _Sequence) -> None:
        """Nothing more: ``batch_done`` issues the sequence's next request."""

    # -- batches -----------------------------------------------------------------
    def _issue(self, sequence: _Sequence) -> None:
        """Hand the oldest queued request of ``sequence`` to its instance's batcher."""
        if sequence.in_flight or not sequence.waiting or sequence.slot is self._backlog_slot:
            return
        request = next(iter(sequence.waiting))
        sequence.in_flight = True
        self._as_batch_slot(sequence.slot).ready[request] = sequence

    def _run(self, slot: _BatchSlot) -> None:
        """Start a batch on the slot's instance if it is free and the batcher says so."""
        if slot.busy or not slot.ready:
            return
        live = self._live_ready(slot)
        plan = self._sequence_batcher.plan(live, self._clock.now_ns())
        if plan.count == 0:
            if plan.wait_until_ns:
                self._window.arm(plan.wait_until_ns)
            return
        batch = live[:plan.count]
        for request in batch:
            sequence = slot.ready.pop(request)
            del self._queued[request]
            del sequence.waiting[request]
            slot.executing[request] = sequence
        slot.busy = True
        self._start(batch, slot.instance)

    def _live_ready(self, slot: _BatchSlot) -> list[AdmittedRequest]:
        """The issued requests still queued, oldest first; drops the others."""
        live: list[AdmittedRequest] = []
        for request, sequence in list(slot.ready.items()):
            if self._queued.get(request) is not sequence:
                del slot.ready[request]  # cancelled while queued: its sequence is released
            elif request.stage is not RequestStage.QUEUED:
                # Rescheduled, then ended by a FINAL its model sent from elsewhere.
                del slot.ready[request]
                self._drop_ended(request, sequence)
                sequence.in_flight = False
                self._issue(sequence)
            elif request.cancellation.reason is not None:
                # Cancelled on another thread; its callback has not reached us yet.
                del slot.ready[request]
                self.request_cancelled(request)
            else:
                live.append(request)
        return live

    def _batch_slot(self, instance: Instance) -> _BatchSlot:
        return self._as_batch_slot(self._slots[instance])

    @staticmethod
    def _as_batch_slot(slot: _Slot) -> _BatchSlot:
        assert isinstance(slot, _BatchSlot)
        return slot
