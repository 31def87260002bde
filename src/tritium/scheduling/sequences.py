"""Sequence scheduling shared by the strategies: correlation ids, flags, controls, release.

A stateful model keeps a sequence's state in the instance that served its first request, so
every request of a sequence (same correlation id, from START to END) runs on that instance
(a *slot* here), one at a time, in arrival order. How sequences are placed on slots and
batched is the strategy's: ``sequence_direct`` (Triton's default) and ``sequence_oldest``.

A sequence is released by its END request, by ``max_sequence_idle_microseconds`` without a
request, or by the cancellation of one of its queued requests, which cancels its other
queued requests too (the model never sees them). Once released, its correlation id needs a
START again. A sequence that waits in the backlog (no room for it yet) is also released
once the earliest ``timeout`` of its requests passes there, as Triton's sequence batcher
does: its queued requests are answered UNAVAILABLE and counted REJECTED.

Iterative sequences (``iterative_sequence: true``), as Triton's IterativeSequencer: a request
without a correlation id gets one of its own, with START; a request its model releases with
RELEASE_RESCHEDULE goes back behind its sequence's queued requests with neither START nor END,
and the first execution that does not reschedule it ends its sequence.
"""

from __future__ import annotations

import collections
import itertools
import logging
from collections.abc import Sequence

import numpy as np

from tritium.core.cancellation import CancelReason
from tritium.core.errors import ErrorCode, TritiumError, invalid
from tritium.core.request import (
    RELEASE_ALL,
    RELEASE_RESCHEDULE,
    SEQUENCE_END,
    SEQUENCE_START,
    AdmittedRequest,
    InferenceRequest,
    RequestStage,
)
from tritium.core.response import InferenceResponse, ResponseStream
from tritium.core.types import DataType, Tensor
from tritium.scheduling.clock import Alarm, Clock
from tritium.scheduling.policy import ControlKind, SchedulerPolicy, SequenceControl
from tritium.scheduling.scheduler import Instance, ModelScheduler, _finished

log = logging.getLogger("tritium.scheduler")

CorrelationId = int | str


class _Slot:
    """One instance and the sequences bound to it."""

    __slots__ = ("instance", "sequences")

    def __init__(self, instance: Instance):
        self.instance = instance
        self.sequences = 0  # active (not released) sequences bound here


class _Sequence:
    __slots__ = ("correlation_id", "expires_ns", "in_flight", "outstanding", "released", "slot",
                 "waiting")

    def __init__(self, correlation_id: CorrelationId, slot: _Slot):
        self.correlation_id = correlation_id
        self.slot = slot
        self.waiting: dict[AdmittedRequest, None] = {}  # queued, in arrival order
        self.outstanding = 0  # queued or executing
        self.released = False
        self.in_flight = False  # oldest strategy: a request issued to the batcher or running
        self.expires_ns = 0  # while backlogged: when its requests' earliest timeout passes


class SequenceScheduler(ModelScheduler):
    """``ModelScheduler``'s interface for a model with ``sequence_batching``; a strategy
    places and dispatches (``add_instances``, ``batch_done``, ``_dispatch``, ``_arrived``,
    ``_requeued``)."""

    def __init__(self, model_name: str, version: int, policy: SchedulerPolicy,
                 decoupled: bool = False, clock: Clock | None = None):
        super().__init__(model_name, version, policy, decoupled, clock)
        assert policy.sequence is not None
        self._controls = policy.sequence.controls
        self._states = policy.sequence.states
        self._iterative = policy.sequence.iterative
        self._own_ids = itertools.count(1)  # an iterative request's own correlation ids
        self._control_shape = (1, 1) if policy.max_batch_size > 0 else (1,)
        self._idle_ns = policy.sequence.max_idle_us * 1000
        self._slots: dict[Instance, _Slot] = {}
        self._active: dict[CorrelationId, _Sequence] = {}
        self._queued: dict[AdmittedRequest, _Sequence] = {}
        # Active sequences with nothing queued or executing -> since when; insertion order
        # is time order because a sequence is removed before it is added again. Ordered:
        # its first entry is found in O(1) however many were removed before it.
        self._idle_since: collections.OrderedDict[_Sequence, int] = collections.OrderedDict()
        self._reaper = Alarm(self._clock, self._reap)
        # Sequences waiting for room, oldest first: the strategy adds and promotes them.
        self._backlog: dict[_Sequence, None] = {}
        self._backlog_timer = Alarm(self._clock, self._expire_backlog)

    # -- instances ---------------------------------------------------------------
    def add_instances(self, instances: Sequence[Instance]) -> None:
        raise NotImplementedError

    def batch_done(self, instance: Instance, batch: list[AdmittedRequest], exec_ns: int,
                   woken: list[ResponseStream] | None = None) -> None:
        raise NotImplementedError

    def _executed(self, request: AdmittedRequest, sequence: _Sequence) -> None:
        """``request`` of ``sequence`` came back from ``execute``."""
        self._came_back(request, sequence)
        self._settle(sequence)

    def _came_back(self, request: AdmittedRequest, sequence: _Sequence) -> None:
        if self._iterative:
            if _rescheduled(request):
                if request.cancellation.reason is None:
                    self._requeue(request, sequence)
                    return
                _end_cancelled(request)
            # Released without RESCHEDULE: Triton ends an iterative request's sequence.
            self._release(sequence)
        sequence.outstanding -= 1
        if sequence.outstanding == 0 and not sequence.released:
            self._mark_idle(sequence)

    def _settle(self, sequence: _Sequence) -> None:
        """``sequence`` may have one request fewer outstanding: each strategy frees what a
        released sequence with none left held (a slot, a lane, its backlog place)."""

    def _requeue(self, request: AdmittedRequest, sequence: _Sequence) -> None:
        """Queue a rescheduled request again, behind what its sequence has queued; the
        instance runs it once it is free (``batch_done`` dispatches)."""
        request.release_flags = RELEASE_ALL
        request.request.flags = 0  # neither START nor END, as Triton sets them
        self._add_controls(request)
        request.move_to(RequestStage.QUEUED)
        sequence.waiting[request] = None  # ``outstanding`` still counts it
        self._queued[request] = sequence
        self.stats.pending += 1
        self._requeued(request, sequence)

    def _requeued(self, request: AdmittedRequest, sequence: _Sequence) -> None:
        """``request`` of ``sequence`` was rescheduled and queued again."""
        raise NotImplementedError

    def _dispatch(self) -> None:
        raise NotImplementedError

    # -- requests ----------------------------------------------------------------
    def enqueue(self, request: AdmittedRequest) -> None:
        if not self.accepting:
            raise self._not_accepting()
        if not request.request.correlation_id:
            if not self._iterative:
                raise invalid(f"inference request to model '{self.model_name}' must specify "
                              "a non-zero or non-empty correlation ID")
            # A sequence of its own, as Triton's IterativeSequencer gives it.
            request.request.correlation_id = next(self._own_ids)
            request.request.flags = SEQUENCE_START
        self._add_controls(request)  # before the sequence is bound: it may refuse
        sequence = self._sequence_for(request)
        request.move_to(RequestStage.QUEUED)
        sequence.waiting[request] = None
        sequence.outstanding += 1
        self._queued[request] = sequence
        self._idle_since.pop(sequence, None)
        if request.request.flags & SEQUENCE_END:
            self._release(sequence)
        self.stats.pending += 1
        self._arrived(request, sequence)
        timeout_us = request.request.timeout_us
        if timeout_us and sequence in self._backlog:
            self._bound_backlog_wait(sequence, request.arrival_ns + timeout_us * 1000)

    def _arrived(self, request: AdmittedRequest, sequence: _Sequence) -> None:
        """``request`` was queued for ``sequence``."""
        raise NotImplementedError

    def request_cancelled(self, request: AdmittedRequest) -> None:
        self._forget_cancelled(request)
        self._dispatch()  # a backlogged sequence may have taken the released one's place

    def _forget_cancelled(self, request: AdmittedRequest) -> None:
        """A cancelled request's bookkeeping, without dispatching what it frees."""
        sequence = self._queued.pop(request, None)
        if sequence is not None:
            self._unqueue(request, sequence)
            self._count_cancel(request, "queued")
            self._cancel_sequence(sequence, request)
        elif request.stage is RequestStage.EXECUTING and not _finished(request):
            self._count_cancel(request, "executing")

    # -- sequences ---------------------------------------------------------------
    def _sequence_for(self, request: AdmittedRequest) -> _Sequence:
        """The sequence ``request`` belongs to, bound to a slot; refuses a request that
        continues a sequence that is not active."""
        correlation_id = request.request.correlation_id
        sequence = self._active.get(correlation_id)
        if not request.request.flags & SEQUENCE_START:
            if sequence is None:
                raise invalid(
                    f"inference request for sequence {correlation_id} to model "
                    f"'{self.model_name}' must specify the START flag on the first request "
                    "of the sequence")
            return sequence
        if sequence is not None:
            # As Triton does: the new sequence takes over the old one's slot.
            log.info("sequence %s for model '%s' version %d started again before its END; "
                     "the previous sequence is ended", correlation_id, self.model_name,
                     self.version)
            self._release(sequence)
            slot = sequence.slot
        else:
            slot = self._least_loaded_slot()
        sequence = _Sequence(correlation_id, slot)
        slot.sequences += 1
        self._active[correlation_id] = sequence
        return sequence

    def _least_loaded_slot(self) -> _Slot:
        if not self._slots:
            raise TritiumError(ErrorCode.UNAVAILABLE,
                               f"model '{self.model_name}' has no instance to serve sequences")
        return min(self._slots.values(), key=lambda slot: slot.sequences)

    def _release(self, sequence: _Sequence) -> None:
        """Unbind ``sequence``: its correlation id needs a START again. Its requests still
        queued or executing are left as they are."""
        if sequence.released:
            return
        sequence.released = True
        if self._active.get(sequence.correlation_id) is sequence:
            del self._active[sequence.correlation_id]
        sequence.slot.sequences -= 1
        self._idle_since.pop(sequence, None)

    def _cancel_sequence(self, sequence: _Sequence, cause: AdmittedRequest) -> None:
        """A queued request of ``sequence`` was cancelled: so are its other queued requests,
        with the same reason, and the sequence is released."""
        self._release(sequence)
        reason = cause.cancellation.reason or CancelReason.CLIENT_CANCELLED
        others = list(sequence.waiting)
        for other in others:
            del self._queued[other]
            self._unqueue(other, sequence)
            # Unqueued first, so the callback's request_cancelled finds nothing to do.
            other.cancellation.cancel(reason)
            self._count_cancel(other, "queued")
        log.info("sequence %s for model '%s' version %d released: request %s was cancelled "
                 "while queued (%d more of its requests cancelled)", sequence.correlation_id,
                 self.model_name, self.version, cause.describe(), len(others),
                 extra={"request_id": cause.describe(), "model": self.model_name,
                        "version": self.version, "cancel_stage": "queued",
                        "cancel_reason": reason.value})

    # -- backlog timeouts ----------------------------------------------------------
    def _bound_backlog_wait(self, sequence: _Sequence, deadline_ns: int) -> None:
        if not sequence.expires_ns or deadline_ns < sequence.expires_ns:
            sequence.expires_ns = deadline_ns
        self._backlog_timer.arm(sequence.expires_ns)

    def _expire_backlog(self) -> None:
        now = self._clock.now_ns()
        for sequence in list(self._backlog):
            expires = sequence.expires_ns
            if not expires:
                continue
            if expires <= now:
                self._reject_backlogged(sequence)
            else:
                self._backlog_timer.arm(expires)

    def _reject_backlogged(self, sequence: _Sequence) -> None:
        """``sequence`` waited in the backlog past a timeout: it is released and its queued
        requests are answered (Triton's words), counted REJECTED."""
        self._release(sequence)
        waiting = list(sequence.waiting)
        error = TritiumError(ErrorCode.UNAVAILABLE,
                             "timeout of the corresponding sequence has been expired")
        for request in waiting:
            del self._queued[request]
            self._unqueue(request, sequence)
            self._rejected.add(request)
            request.stream.close_with(InferenceResponse.failure(error))
        log.info("sequence %s for model '%s' version %d released: its timeout passed while it "
                 "waited in the backlog (%d requests rejected)", sequence.correlation_id,
                 self.model_name, self.version, len(waiting))

    def _mark_idle(self, sequence: _Sequence) -> None:
        now = self._clock.now_ns()
        self._idle_since[sequence] = now
        self._reaper.arm(now + self._idle_ns)

    def _reap(self) -> None:
        """Release the sequences idle for longer than ``max_sequence_idle_microseconds``."""
        now = self._clock.now_ns()
        idle = self._idle_since
        while idle:
            sequence, since = next(iter(idle.items()))
            if since + self._idle_ns > now:
                self._reaper.arm(since + self._idle_ns)
                break
            self._release(sequence)
            log.info("sequence %s for model '%s' version %d released: no request for %d us",
                     sequence.correlation_id, self.model_name, self.version,
                     self._idle_ns // 1000)
        self._dispatch()  # a backlogged sequence may take a released one's place

    # -- dispatch ----------------------------------------------------------------
    def _drop_ended(self, request: AdmittedRequest, sequence: _Sequence) -> None:
        del self._queued[request]
        del sequence.waiting[request]
        self.stats.pending -= 1
        sequence.outstanding -= 1
        if self._iterative:
            self._release(sequence)
        self._settle(sequence)

    def _unqueue(self, request: AdmittedRequest, sequence: _Sequence) -> None:
        request.move_to(RequestStage.DONE)
        del sequence.waiting[request]
        sequence.outstanding -= 1
        self.stats.pending -= 1
        self._settle(sequence)

    # -- control tensors ---------------------------------------------------------
    def _add_controls(self, request: AdmittedRequest) -> None:
        shape = self._control_shape
        decoded = request.request
        for control in self._controls:
            data = _control_value(control, decoded).reshape(shape)
            decoded.inputs[control.name] = Tensor(control.name, control.datatype, shape, data)
        for state in self._states:
            decoded.inputs[state.input_name] = state.tensor()


def _end_cancelled(request: AdmittedRequest) -> None:
    """A rescheduled request cancelled while it executed is not run again: no execution
    will answer it, so it ends here (a BLS child its parent cancelled is still open)."""
    reason = request.cancellation.reason
    assert reason is not None
    request.stream.close_with(InferenceResponse.failure(reason.to_error()))


def _rescheduled(request: AdmittedRequest) -> bool:
    """The model released ``request`` with RESCHEDULE and someone still waits for it."""
    return (request.release_flags == RELEASE_RESCHEDULE
            and request.stage is RequestStage.EXECUTING and not request.stream.closed)


def _control_value(control: SequenceControl, request: InferenceRequest) -> np.ndarray:
    kind = control.kind
    if kind is ControlKind.CORRID:
        return _correlation_array(control, request.correlation_id)
    if kind is ControlKind.READY:
        on = True
    else:
        on = bool(request.flags & (SEQUENCE_START if kind is ControlKind.START else SEQUENCE_END))
    value = control.true_value if on else control.false_value
    return np.array([value], dtype=control.datatype.numpy)


def _correlation_array(control: SequenceControl, correlation_id: CorrelationId) -> np.ndarray:
    if control.datatype is DataType.BYTES:
        return np.array([str(correlation_id).encode()], dtype=np.object_)
    if isinstance(correlation_id, str):
        raise invalid(f"sequence batching control input '{control.name}' expects a numeric "
                      f"correlation ID ({control.datatype.config}), got string "
                      f"'{correlation_id}'")
    try:
        return np.array([correlation_id], dtype=control.datatype.numpy)
    except OverflowError:
        raise invalid(f"correlation ID {correlation_id} does not fit sequence batching "
                      f"control input '{control.name}' ({control.datatype.config})") from None
