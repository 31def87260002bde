"""A supervised instance slot: one instance process at a time, restarted when it dies.

The scheduler sees one ``SupervisedInstance`` (``kinds.Instance``) for the life
of the model; behind it instance processes come and go. When one dies, however it died,
the requests it was executing are answered at once with Triton's error (the process kind
answers them; the supervisor sweeps up any it missed), the death is logged with its cause,
and a new process starts after a backoff (``restart.Backoff``). While no process is up the
slot stays busy, so the scheduler keeps requests queued (where cancellation and timeouts
still reach them) or gives them to the model's other instances, and ``ready`` is False.

Opt-in per model (``TRITIUM_KILL_AFTER_CANCEL_SECS``): when every request of a batch is
cancelled and ``execute`` has still not returned that many seconds later, the process is
killed and restarted, so the slot is freed and the work really stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from tritium.core.cancellation import Cancellation
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.request import AdmittedRequest
from tritium.core.response import InferenceResponse, ResponseStream, wake_all
from tritium.execution.backend import InstanceInfo
from tritium.execution.process.restart import (
    STUB_UNHEALTHY,
    Backoff,
    RestartPolicy,
    describe_exit,
)

log = logging.getLogger("tritium.execution")

KILL_AFTER_CANCEL = "TRITIUM_KILL_AFTER_CANCEL_SECS"
# Batches a process instance may hold at once (the scheduler gives a model of several
# instances fewer each). Measured on the identity model at 16 concurrent clients, server
# CPU per inference over all processes: 1 -> 307 µs, 2 -> 227, 4 -> 179-191, 8 -> 163,
# 16 -> 142 (the thread kind's figure). Each waiting batch costs a cancel-flag slot and
# its inputs' room in the arena, nothing else.
DEPTH = 16


class InstanceProcess(Protocol):
    """What the supervisor needs of one instance process (``process.instance``)."""

    @property
    def pid(self) -> int | None: ...
    @property
    def returncode(self) -> int | None: ...
    @property
    def is_async(self) -> bool: ...
    async def start(self) -> None: ...
    def submit(self, batch: list[AdmittedRequest]) -> None: ...
    def stop(self) -> None: ...
    async def wait_stopped(self) -> None: ...
    def exited(self) -> Awaitable[int]: ...
    def kill(self) -> None: ...
    def report_to(self, owner: Any, on_done: SlotDone) -> bool:
        """Whether it reports the dones of batches it ran straight to ``on_done`` as
        ``owner``'s from now on (it took the callback), rather than through its own."""
    @property
    def alive(self) -> bool:
        """False once the child is known gone (end of file on the link comes before the
        exit status, and before ``exited`` resolves)."""


# (the process reporting, batch, execute nanoseconds or -1, streams to wake)
ProcessDone = Callable[[Any, list[AdmittedRequest], int, list[ResponseStream]], None]
ProcessFactory = Callable[[ProcessDone], InstanceProcess]
SlotDone = Callable[[Any, list[AdmittedRequest], int, list[ResponseStream]], None]


def kill_after_cancel_secs(config: Any) -> float | None:
    """The model's ``TRITIUM_KILL_AFTER_CANCEL_SECS`` (seconds, > 0), or None when unset."""
    parameter = config.parameters.get(KILL_AFTER_CANCEL) if config.parameters else None
    if parameter is None or not parameter.string_value.strip():
        return None
    try:
        seconds = float(parameter.string_value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise TritiumError(ErrorCode.INVALID_ARG, (
            f"model '{config.name}': parameter {KILL_AFTER_CANCEL} must be a number of "
            f"seconds greater than 0, got '{parameter.string_value}'"))
    return seconds


class _Flight:
    """The kill-after-cancel watch of a batch in flight (only where the option is set)."""

    __slots__ = ("batch", "follow", "timer")

    def __init__(self, batch: list[AdmittedRequest]):
        self.batch = batch
        self.follow: Cancellation | None = None
        self.timer: asyncio.TimerHandle | None = None

    def disarm(self) -> None:
        if self.follow is not None:
            self.follow.detach()
            self.follow = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class SupervisedInstance:
    kind = "process"

    def __init__(self, info: InstanceInfo, make_process: ProcessFactory,
                 loop: asyncio.AbstractEventLoop, on_done: SlotDone,
                 policy: RestartPolicy | None = None,
                 kill_after_cancel_s: float | None = None,
                 prepare: Callable[[], Awaitable[None]] | None = None):
        self.info = info
        self.name = info.instance_name
        self.restarts = 0
        self._make_process = make_process
        self._loop = loop
        self._on_done = on_done
        self._backoff = Backoff(policy)
        self._kill_after = kill_after_cancel_s
        self._prepare = prepare  # awaited once before the first process starts
        self._process: InstanceProcess | None = None
        # The current process when it reports its dones straight to the scheduler (none
        # then passes through ``_process_done`` but those of batches it did not run).
        self._straight: InstanceProcess | None = None
        self._up = False
        self._stopping = False
        # Batches handed to the current process and not reported done yet, by id.
        self._flights: dict[int, list[AdmittedRequest]] = {}
        self._armed: dict[int, _Flight] = {}  # their kill-after-cancel watches, by batch id
        # Dones of batches that died with a process: reported once a new one is up.
        self._deferred: list[tuple[list[AdmittedRequest], int]] = []
        self._waiting: list[list[AdmittedRequest]] = []  # submitted while none was up
        self._kill_cause = ""
        self.failure: TritiumError | None = None  # why the slot gave up restarting
        self._supervisor: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    @property
    def ready(self) -> bool:
        """A process is up and serving (False from the moment its death is known)."""
        return self._up and self._process is not None and self._process.alive

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def depth(self) -> int:
        """Batches it takes at once: the process finds its next batch waiting when it
        finishes one, instead of sleeping until the loop hears DONE and sends it, and
        under load one wake-up on either side carries many (see ``DEPTH``). One for an
        ``async def execute`` (a second batch would run beside the first) and where a
        cancelled batch is killed after a grace period (a batch waiting behind a long one
        would count its wait as running)."""
        process = self._process
        if self._kill_after is not None or (process is not None and process.is_async):
            return 1
        return DEPTH

    # -- kinds.Instance ----------------------------------------------------------
    async def start(self) -> None:
        """Start the first process; its failure fails the load, as a thread's would."""
        if self._prepare is not None:
            await self._prepare()
        self._process = await self._launch()
        self._up = True
        self._serve_straight()
        self._backoff.started()
        self._supervisor = self._loop.create_task(self._supervise(),
                                                  name=f"supervise-{self.name}")

    def submit(self, batch: list[AdmittedRequest]) -> None:
        process = self._process
        if self.failure is not None:
            # Given up: each request is answered why at once (once the scheduler is done
            # handing it over), and the slot stays free so the queue drains to it.
            self._loop.call_soon(self._refuse, batch, self.failure)
            return
        if not self._up or process is None:
            # The spare place of a process that died: the batch waits for the next one.
            self._waiting.append(batch)
            return
        if process is not self._straight:
            self._flights[id(batch)] = batch
            if self._kill_after is not None:
                self._arm(batch)
        process.submit(batch)

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._up and self._process is not None:
            self._process.stop()
        self._refuse_waiting(TritiumError(ErrorCode.UNAVAILABLE, (
            f"instance {self.name} of model '{self.info.model_name}' is stopping")))
        self._report_deferred()

    async def wait_stopped(self) -> None:
        if self._supervisor is not None:
            await asyncio.shield(self._supervisor)
        process = self._process
        if process is not None and process.returncode is None:
            await process.wait_stopped()

    # -- dones -------------------------------------------------------------------
    def _process_done(self, process: Any, batch: list[AdmittedRequest], exec_ns: int,
                      woken: list[ResponseStream]) -> None:
        key = id(batch)
        if self._flights.pop(key, None) is None and process is not self._straight:
            return  # swept up at its process's death already
        if self._armed:
            flight = self._armed.pop(key, None)
            if flight is not None:
                flight.disarm()
        # Stopping: nothing to restart, the slot's state no longer matters.
        if self._stopping or (process.alive and process is self._process and self._up):
            self._on_done(self, batch, exec_ns, woken)
            return
        # Its process is dead: the answers go out now, the slot comes back once restarted.
        wake_all(woken)
        self._deferred.append((batch, exec_ns))

    def _report_deferred(self) -> None:
        deferred, self._deferred = self._deferred, []
        for batch, exec_ns in deferred:
            self._on_done(self, batch, exec_ns, [])

    # -- life and death ------------------------------------------------------------
    def _serve_straight(self) -> None:
        """While the new process lives, it reports what it ran to the scheduler itself:
        no hop through this slot per batch. Not where a cancelled batch is killed after
        its grace (each batch's watch is disarmed here when it is done)."""
        process = self._process
        self._straight = None
        if (process is not None and self._kill_after is None
                and process.report_to(self, self._on_done)):
            self._straight = process

    async def _launch(self) -> InstanceProcess:
        process = self._make_process(self._process_done)
        await process.start()
        return process

    async def _supervise(self) -> None:
        while not self._stopping:
            process = self._process
            assert process is not None
            code = await process.exited()
            if self._stopping:
                return
            self._up = False
            await asyncio.sleep(0)  # the process kind answers its in-flight batch first
            self._sweep()
            delay = self._backoff.died()
            self._log_death(process, code, delay)
            if not await self._restart(delay):
                return

    async def _restart(self, delay: float) -> bool:
        """Start processes until one is up (True), or the slot is stopped or gives up
        after ``max_failed_starts`` failed starts in a row (False)."""
        failed = 0
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()
            if self._stopping:
                return False
            try:
                process = await self._launch()
            except Exception as exc:
                failed += 1
                if failed >= self._backoff.policy.max_failed_starts:
                    self._give_up(exc, failed)
                    return False
                delay = self._backoff.died()
                log.error("instance %s of model '%s' version %d failed to restart: %s; "
                          "retrying in %.2f s", self.name, self.info.model_name,
                          self.info.model_version, exc, delay)
                continue
            if self._stopping:
                process.stop()
                self._process = process
                return False
            self._process, self._up = process, True
            self._serve_straight()
            self.restarts += 1
            self._backoff.started()
            log.info("instance %s of model '%s' version %d restarted (pid %s, restart %d)",
                     self.name, self.info.model_name, self.info.model_version, process.pid,
                     self.restarts)
            self._report_deferred()
            waiting, self._waiting = self._waiting, []
            for batch in waiting:
                self.submit(batch)
            return True
        return False

    def _refuse(self, batch: list[AdmittedRequest], error: TritiumError) -> None:
        self._fail([batch], error)
        self._on_done(self, batch, -1, [])

    def _refuse_waiting(self, error: TritiumError) -> None:
        waiting, self._waiting = self._waiting, []
        for batch in waiting:
            self._loop.call_soon(self._refuse, batch, error)

    def _give_up(self, exc: Exception, failed: int) -> None:
        reason = exc.message if isinstance(exc, TritiumError) else str(exc)
        self.failure = TritiumError(ErrorCode.UNAVAILABLE, (
            f"instance {self.name} of model '{self.info.model_name}' failed to start "
            f"{failed} times in a row and is not restarted again: {reason}"))
        log.error("%s", self.failure.message)
        self._report_deferred()
        self._refuse_waiting(self.failure)

    def _sweep(self) -> None:
        """Answer and set aside what the dead process left in flight."""
        batches = list(self._flights.values())
        self._flights.clear()
        for flight in self._armed.values():
            flight.disarm()
        self._armed.clear()
        self._fail(batches)
        self._deferred.extend((batch, -1) for batch in batches)

    def _fail(self, batches: list[list[AdmittedRequest]],
              error: TritiumError | None = None) -> None:
        error = error or TritiumError(ErrorCode.INTERNAL,
                                      STUB_UNHEALTHY.format(instance=self.name))
        for batch in batches:
            for request in batch:
                if not request.stream.closed:
                    request.stream.close_with(InferenceResponse.failure(error))

    def _log_death(self, process: InstanceProcess, code: int, delay: float) -> None:
        cause, self._kill_cause = self._kill_cause, ""
        # Triton's words for the same event (python_be.cc, before restarts were dropped).
        log.error("Stub process '%s' is unhealthy and it will be restarted: process %s of "
                  "model '%s' version %d %s%s; restarting in %.2f s", self.name, process.pid,
                  self.info.model_name, self.info.model_version, describe_exit(code),
                  f" ({cause})" if cause else "", delay)

    # -- kill after a cancellation's grace period ------------------------------------
    def _arm(self, batch: list[AdmittedRequest]) -> None:
        flight = self._armed[id(batch)] = _Flight(batch)
        follow = Cancellation.following(self._loop, [r.cancellation for r in batch])
        flight.follow = follow
        follow.add_callback(lambda _c: self._start_grace(flight))

    def _start_grace(self, flight: _Flight) -> None:
        if self._armed.get(id(flight.batch)) is not flight or self._kill_after is None:
            return
        flight.timer = self._loop.call_later(self._kill_after, self._kill_for, flight)

    def _kill_for(self, flight: _Flight) -> None:
        process = self._process
        if self._armed.get(id(flight.batch)) is not flight or process is None:
            return
        self._kill_cause = (f"killed by tritium: execute() had not returned "
                            f"{self._kill_after:g} s after its request(s) were cancelled, "
                            f"{KILL_AFTER_CANCEL}")
        log.warning("instance %s of model '%s': cancelled request(s) still executing after "
                    "%g s (%s); killing process %s", self.name, self.info.model_name,
                    self._kill_after, KILL_AFTER_CANCEL, process.pid)
        process.kill()
