"""Per-model scheduler: admits requests, queues them, hands batches to free instances.

Runs on the event loop only. Instances report back through ``batch_done`` (scheduled
onto the loop by ``execution/``). Two timers at most, both owned here: the dynamic
batcher's window and the earliest queue timeout.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Protocol

from tritium.core.cancellation import CancelReason
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.request import AdmittedRequest, RequestStage
from tritium.core.response import ResponseStream, wake_all
from tritium.core.statistics import ModelStatistics
from tritium.scheduling.batcher import Batcher
from tritium.scheduling.clock import Alarm, Clock, LoopClock
from tritium.scheduling.deadlines import Deadlines
from tritium.scheduling.ordering import OrderedDelivery
from tritium.scheduling.policy import QueuePolicy, SchedulerPolicy, TimeoutAction
from tritium.scheduling.queue import RequestQueue

__all__ = ["Instance", "ModelScheduler", "QueuePolicy", "SchedulerPolicy", "TimeoutAction"]

log = logging.getLogger("tritium.scheduler")

_QUEUED = RequestStage.QUEUED
_EXECUTING = RequestStage.EXECUTING
_DONE = RequestStage.DONE


class Instance(Protocol):
    name: str

    def submit(self, batch: list[AdmittedRequest]) -> None: ...


SHARED_DEPTH = 2  # batches each instance of a model of several may hold at once


def depth_of(instance: Instance) -> int:
    """How many batches ``instance`` takes at once (``kinds.Instance.depth``; 1 for
    instances that do not say)."""
    depth: int = getattr(instance, "depth", 1)
    return max(1, depth)


class ModelScheduler:
    def __init__(self, model_name: str, version: int, policy: SchedulerPolicy,
                 decoupled: bool = False, clock: Clock | None = None):
        self.model_name = model_name
        self.decoupled = decoupled
        self.version = version
        self.policy = policy
        self.stats = ModelStatistics()
        self.accepting = True
        self._clock: Clock = clock if clock is not None else LoopClock()
        self._queue = RequestQueue(policy.priority_levels, policy.default_priority)
        self._idle: list[Instance] = []
        self._level_policies = policy.level_policies()
        self._bounded = any(p.max_queue_size for p in self._level_policies)
        self._batcher = Batcher(policy) if policy.dynamic_batching else None
        self._window = Alarm(self._clock, self._dispatch)
        self._deadlines = (Deadlines(self._clock, self._expire, self._dispatch)
                           if policy.has_timeouts() else None)
        # Requests this scheduler turned away after admission (a queue timeout, a sequence's
        # backlog timeout): counted REJECTED, not CANCELED or BACKEND, when they finish
        # (which removes them from here).
        self._rejected: set[AdmittedRequest] = set()
        self._ordered = OrderedDelivery() if policy.preserve_ordering else None
        # No batcher to wait for and no queue timeout to arm: a request that finds an
        # instance free and nothing queued would be pushed and popped at once, so it goes
        # straight to the instance (``enqueue``).
        self._straight = self._batcher is None and self._deadlines is None
        # Deep instances (see add_instances): the batches each holds, and those given to
        # one while it runs another, which wait there still counted as queued. Empty
        # unless a deep instance was added.
        self._held: dict[Instance, int] = {}
        self._waiting: dict[Instance, collections.deque[list[AdmittedRequest]]] = {}
        self._skipped: set[AdmittedRequest] = set()  # cancelled while waiting there

    # -- instances ---------------------------------------------------------------
    def add_instances(self, instances: Sequence[Instance]) -> None:
        """An instance deeper than one batch (a process instance, which then finds its
        next batch waiting instead of sleeping until the loop sends it) gets its spare
        places at the bottom of ``_idle``: a free instance is always chosen first. A batch
        sent to a busy instance stays queued for every count until the one before it is
        done (the instance runs them in order). Only where nothing could reorder or
        bound the queue meanwhile: no dynamic batcher (a batch formed while the previous
        runs would be smaller), no queue timeouts or size limit, one priority level."""
        deep = (self._straight and not self._bounded and self.policy.priority_levels <= 1)
        # One instance: its batches run in queue order wherever they wait. Several: a batch
        # waiting at a busy instance cannot move to one that became free, so each gets one
        # spare place only.
        most = SHARED_DEPTH if len(instances) > 1 else None
        spare: list[Instance] = []
        for instance in instances:
            depth = depth_of(instance) if deep else 1
            if most is not None:
                depth = min(depth, most)
            if depth > 1:
                self._held[instance] = 0
                self._waiting[instance] = collections.deque()
                spare.extend([instance] * (depth - 1))
        self._idle[:0] = spare
        self._idle.extend(instances)
        self._dispatch()

    def batch_done(self, instance: Instance, batch: list[AdmittedRequest], exec_ns: int,
                   woken: list[ResponseStream] | None = None) -> None:
        """An instance finished ``execute`` for ``batch`` (in ``exec_ns``) and can take more;
        ``woken`` are the streams whose responses it returned, still to be woken."""
        if self._ordered is not None:
            self._ordered.finished(batch, woken or [])
        elif woken:
            wake_all(woken)
        stats = self.stats
        size = 0
        never_ran = 0
        skipped = self._skipped
        for request in batch:
            if skipped and request in skipped:  # cancelled before the instance began it
                skipped.discard(request)
                never_ran += 1
                continue
            size += request.batch_size
            if self.decoupled:
                continue  # a decoupled request goes on after execute() returns, until FINAL
            if request.stage is _EXECUTING:
                request.move_to(_DONE)
            cancelled_at = request.cancellation.cancelled_at_ns
            if cancelled_at:
                stats.record_cancel_stop(self._clock.now_ns() - cancelled_at, cancelled_at)
        stats.executing -= len(batch) - never_ran
        if exec_ns >= 0:
            stats.record_execution(size, len(batch) - never_ran, exec_ns)
        if self._held:
            self._free(instance)
        else:
            self._idle.append(instance)
        self._dispatch()

    def _free(self, instance: Instance) -> None:
        """A batch of ``instance`` is done: the next one waiting there begins, and the
        place comes back (a spare one while the instance still runs a batch)."""
        held = self._held.get(instance)
        if held is None:
            self._idle.append(instance)
            return
        self._held[instance] = held - 1
        waiting = self._waiting[instance]
        if waiting:
            self._begin(waiting.popleft(), waited=True)
        if held > 1:
            self._idle.insert(0, instance)
        else:
            self._idle.append(instance)

    # -- requests ----------------------------------------------------------------
    def enqueue(self, request: AdmittedRequest) -> None:
        if not self.accepting:
            raise self._not_accepting()
        if self._bounded:
            self._check_room(request)
        if (self._straight and self._idle and not self._queue.size
                and request.cancellation.reason is None):
            instance = self._idle.pop()
            held = self._held
            if held and instance in held:
                if held[instance]:  # a busy deep instance: it waits there
                    request.move_to(_QUEUED)
                    self.stats.pending += 1
                    self._start([request], instance)
                    return
                held[instance] = 1  # an idle one begins it at once
            self._begin_lone(request, instance)
            return
        self._queue.push(request)
        self.stats.pending += 1
        if self._deadlines is not None:
            self._arm_deadline(request)
        if self._idle:
            self._dispatch()

    def request_cancelled(self, request: AdmittedRequest) -> None:
        if self._queue.discard(request):
            self.stats.pending -= 1
            self._count_cancel(request, "queued")
        elif (self._held and request.stage is _EXECUTING and request not in self._skipped
              and self._waits_at_instance(request)):
            self._skipped.add(request)  # the instance skips it (its cancel flag is set)
            self.stats.pending -= 1
            self._count_cancel(request, "queued")
        elif request.stage is RequestStage.EXECUTING and not _finished(request):
            self._count_cancel(request, "executing")

    def model_stopped(self, request: AdmittedRequest) -> None:
        """A decoupled model sent FINAL for a request after it was cancelled."""
        cancelled_at = request.cancellation.cancelled_at_ns
        if cancelled_at:
            self.stats.record_cancel_stop(self._clock.now_ns() - cancelled_at, cancelled_at)

    def request_finished(self, request: AdmittedRequest, error: TritiumError | None) -> None:
        """Count the outcome once the request's final response was sent."""
        stats = self.stats
        if request.stage is not _DONE:
            request.move_to(_DONE)
        elapsed = self._clock.now_ns() - request.arrival_ns
        if request.cancellation.reason is not None or error is not None:
            if self._rejected and request in self._rejected:
                self._rejected.discard(request)
                stats.failures["REJECTED"] += 1
            elif request.cancellation.reason is not None:
                stats.failures["CANCELED"] += 1
            else:
                stats.failures["BACKEND"] += 1
            stats.fail.add(elapsed)
        else:
            success = stats.success  # once per request: Duration.add written out
            success.count += 1
            success.ns += elapsed
            stats.inference_count += request.batch_size
            stats.last_inference_ms = time.time_ns() // 1_000_000

    # -- admission and timeouts --------------------------------------------------
    def _not_accepting(self) -> TritiumError:
        return TritiumError(
            ErrorCode.UNAVAILABLE,
            f"model '{self.model_name}' version {self.version} is not accepting new requests",
        )

    def _check_room(self, request: AdmittedRequest) -> None:
        level = self._queue.level_of(request)
        limit = self._level_policies[level].max_queue_size
        if limit and self._queue.level_size(level) >= limit:
            self.stats.failures["REJECTED"] += 1
            raise TritiumError(ErrorCode.UNAVAILABLE, "Exceeds maximum queue size")

    def _arm_deadline(self, request: AdmittedRequest) -> None:
        assert self._deadlines is not None
        policy = self._level_policies[self._queue.level_of(request)]
        timeout_us = policy.timeout_us(request.request.timeout_us)
        if timeout_us:
            self._deadlines.add(request, request.arrival_ns + timeout_us * 1000)

    def _expire(self, request: AdmittedRequest) -> None:
        """``request``'s queue timeout passed while it was still queued."""
        policy = self._level_policies[self._queue.level_of(request)]
        self.stats.expired[policy.timeout_action.name] += 1
        if policy.timeout_action is TimeoutAction.DELAY:
            self._queue.delay(request)
            return
        self._rejected.add(request)
        if not request.cancellation.cancel(CancelReason.DEADLINE):
            self._rejected.discard(request)  # cancelled for another reason just before
        # Idempotent; needed when nobody listens to the cancellation (direct use).
        self.request_cancelled(request)

    def _count_cancel(self, request: AdmittedRequest, stage: str) -> None:
        cancellation = request.cancellation
        reason = cancellation.reason
        self.stats.record_cancel(request.describe(), reason.name if reason else "UNKNOWN", stage,
                                 cancellation.cancelled_at_ns)
        log.info(
            "request %s for model '%s' version %d cancelled while %s: %s",
            request.describe(), self.model_name, self.version, stage,
            reason.value if reason else "unknown",
        )

    # -- dispatch ----------------------------------------------------------------
    def _dispatch(self) -> None:
        queue = self._queue
        while self._idle and queue.size:
            batch = self._next_batch() if self._batcher is None else self._next_dynamic()
            if not batch:
                return
            self._start(batch, self._idle.pop())

    def _start(self, batch: list[AdmittedRequest], instance: Instance) -> None:
        held = self._held
        spare = False
        if held and instance in held:
            spare = held[instance] > 0  # busy: the batch waits there, counted as queued
            held[instance] += 1
        if spare:
            for request in batch:
                request.move_to(_EXECUTING)  # out of the queue, though it waits to begin
            self._waiting[instance].append(batch)
        else:
            self._begin(batch)
        if self._ordered is not None:
            self._ordered.dispatched(batch)
        instance.submit(batch)

    def _begin(self, batch: list[AdmittedRequest], waited: bool = False) -> None:
        """``batch`` begins executing: out of the queue's counts, into execution's. One
        that ``waited`` at its instance left the queue when it was sent; a request of it
        cancelled meanwhile never begins."""
        stats = self.stats
        now = self._clock.now_ns()
        queued = stats.queue  # Duration.add written out: it runs for every request
        if waited:
            skipped = self._skipped
            if skipped:
                batch = [request for request in batch if request not in skipped]
            for request in batch:
                queued.ns += now - request.arrival_ns
        else:
            for request in batch:
                request.move_to(_EXECUTING)
                queued.ns += now - request.arrival_ns
        count = len(batch)
        queued.count += count
        stats.pending -= count
        stats.executing += count

    def _begin_lone(self, request: AdmittedRequest, instance: Instance) -> None:
        """``_start`` and ``_begin`` for the usual request, alone and at once at an idle
        instance: it enters and leaves the queue's counts in the same step, so they are
        not touched."""
        request.move_to(_QUEUED)  # through the queue's stage, as every request goes
        request.move_to(_EXECUTING)
        stats = self.stats
        queued = stats.queue
        queued.count += 1
        queued.ns += self._clock.now_ns() - request.arrival_ns
        stats.executing += 1
        batch = [request]
        if self._ordered is not None:
            self._ordered.dispatched(batch)
        instance.submit(batch)

    def _waits_at_instance(self, request: AdmittedRequest) -> bool:
        return any(request in batch for batches in self._waiting.values()
                   for batch in batches)

    def _next_batch(self) -> list[AdmittedRequest]:
        """Default scheduler: the next live request, alone."""
        queue = self._queue
        while (request := queue.pop()) is not None:
            if request.cancellation.reason is None:
                return [request]
            # Cancelled on another thread; its callback has not reached us yet. Popped, so
            # marked done here: the callback's request_cancelled then finds nothing to do.
            request.move_to(RequestStage.DONE)
            self.stats.pending -= 1
            self._count_cancel(request, "queued")
        return []

    def _next_dynamic(self) -> list[AdmittedRequest]:
        assert self._batcher is not None
        now = self._clock.now_ns()
        if self._deadlines is not None and len(self._deadlines):
            self._deadlines.expire_due(now)
        plan = self._batcher.plan(self._live(), now)
        if plan.count == 0:
            if plan.wait_until_ns:
                self._window.arm(plan.wait_until_ns)
            return []
        queue = self._queue
        batch = []
        for _ in range(plan.count):
            request = queue.pop()
            assert request is not None
            batch.append(request)
        return batch

    def _live(self) -> Iterator[AdmittedRequest]:
        """Queued requests in order, dropping those cancelled since they were queued."""
        for request in self._queue:
            if request.cancellation.reason is None:
                yield request
            else:
                # Only marks the request: the queue's lanes are not changed under us.
                self.request_cancelled(request)

    # -- lifecycle ---------------------------------------------------------------
    def stop_accepting(self) -> None:
        self.accepting = False

    def is_idle(self) -> bool:
        """Nothing queued and no ``execute`` running. Counts, not the in-flight set: they
        are Triton's pending/executing statistics, and a decoupled request leaves
        ``executing`` when ``execute`` returns, not at its FINAL (what an unload waits for,
        in ``LoadedModel``'s InFlight)."""
        return self.stats.pending == 0 and self.stats.executing == 0


def _finished(request: AdmittedRequest) -> bool:
    return request.stream.closed
