"""A model instance: the thread that runs model code, and the only bridge between the
server's event loop and that code.

The loop hands a batch over with ``submit`` (a SimpleQueue put); the thread runs
``backend.execute`` and reports back with one ``call_soon_threadsafe``. A backend whose
``execute`` is a coroutine gets an event loop of its own, run by this thread.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import queue
import threading
import time
from collections.abc import Awaitable, Callable

from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.request import AdmittedRequest
from tritium.core.response import DeferredWakes, InferenceResponse, ResponseStream
from tritium.execution.backend import InstanceInfo, ModelBackend
from tritium.execution.kinds import DoneCallback, InstanceSpec
from tritium.execution.placement import ThreadPlacement, current

log = logging.getLogger("tritium.execution")

BackendFactory = Callable[[InstanceInfo], ModelBackend]

_STOP = None


def build(spec: InstanceSpec) -> ThreadInstance:
    """The thread kind: model code runs on a thread of the server, reaching the server
    through the link in this process."""
    def create(info: InstanceInfo) -> ModelBackend:
        return spec.create_backend(info, spec.config, spec.link)

    return ThreadInstance(spec.info, create, spec.loop, spec.on_done)


class ThreadInstance:
    """``kinds.Instance`` on a thread of the server: never restarted, ready once started."""

    ready = True
    restarts = 0

    def __init__(
        self,
        info: InstanceInfo,
        create_backend: BackendFactory,
        loop: asyncio.AbstractEventLoop,
        on_done: DoneCallback,
    ):
        self.info = info
        self.name = info.instance_name
        self._create_backend = create_backend
        self._loop = loop
        self._on_done = on_done
        self._inbox: queue.SimpleQueue[list[AdmittedRequest] | None] = queue.SimpleQueue()
        self._outbox: list[list[AdmittedRequest]] = []
        self._backend: ModelBackend | None = None
        self._model_loop: asyncio.AbstractEventLoop | None = None
        self._started: asyncio.Future[None] = loop.create_future()
        self._stopped: asyncio.Future[None] = loop.create_future()
        self._placement: ThreadPlacement = current()
        self._thread = threading.Thread(target=self._run, name=f"instance-{self.name}", daemon=True)

    async def start(self) -> None:
        """Start the thread and wait for the model's ``initialize`` to finish."""
        self._thread.start()
        await self._started

    def submit(self, batch: list[AdmittedRequest]) -> None:
        if self._model_loop is not None:
            self._model_loop.call_soon_threadsafe(self._start_async, batch)
            return
        # Handed over once the loop has run what is ready, just before it goes idle: woken
        # earlier, the instance thread would only wait for the GIL the loop still holds (a
        # wasted context switch, costly when it means waking another core).
        self._outbox.append(batch)
        if len(self._outbox) == 1:
            self._loop.call_soon(self._hand_over)

    def _hand_over(self) -> None:
        batches, self._outbox = self._outbox, []
        for batch in batches:
            self._inbox.put(batch)

    def stop(self) -> None:
        """Ask the thread to finalize the model and end; see ``wait_stopped``."""
        if self._model_loop is not None:
            self._model_loop.call_soon_threadsafe(self._model_loop.stop)
        else:
            self._hand_over()  # what was submitted runs before the instance stops
            self._inbox.put(_STOP)

    async def wait_stopped(self) -> None:
        await asyncio.shield(self._stopped)

    # -- the instance thread -----------------------------------------------------
    def _run(self) -> None:
        self._placement.release()  # initialize() is model code
        try:
            self._backend = self._create_backend(self.info)
        except BaseException as exc:
            self._report(self._started, exc)
            self._report(self._stopped, None)
            return
        is_async = bool(getattr(self._backend, "is_async", False))
        if is_async:
            self._model_loop = asyncio.new_event_loop()
        self._report(self._started, None)
        try:
            if self._model_loop is not None:
                self._serve_async(self._model_loop)
            else:
                self._serve()
        finally:
            self._finalize()
            self._report(self._stopped, None)

    def _serve(self) -> None:
        inbox = self._inbox
        self._placement.settle()
        while (batch := inbox.get()) is not _STOP:
            self._execute(batch)

    def _execute(self, batch: list[AdmittedRequest]) -> None:
        # Checked again here: a request cancelled after dispatch never reaches the model.
        live = self._live(batch)
        elapsed = -1
        woken: list[ResponseStream] = []
        if live:
            started = time.monotonic_ns()
            self._placement.widen()
            with DeferredWakes() as woken:
                try:
                    self._backend.execute(live)  # type: ignore[union-attr]
                except BaseException as exc:
                    _fail_batch(live, self.info.model_name, exc)
            elapsed = time.monotonic_ns() - started
            # Home before waking the loop, so the wake-up stays on one core.
            self._placement.narrow()
        self._loop.call_soon_threadsafe(self._on_done, self, batch, elapsed, woken)

    def _serve_async(self, model_loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(model_loop)
        run_model_loop(model_loop)

    def _live(self, batch: list[AdmittedRequest]) -> list[AdmittedRequest]:
        """The requests of ``batch`` not cancelled yet; the others are answered."""
        live: list[AdmittedRequest] = []
        dropped: list[AdmittedRequest] = []
        for request in batch:
            # The reason is read, not is_cancelled() called: this runs for every request.
            (live if request.cancellation.reason is None else dropped).append(request)
        if dropped:
            self._loop.call_soon_threadsafe(_end_unstarted, dropped)
        return live

    def _start_async(self, batch: list[AdmittedRequest]) -> None:
        live = self._live(batch)
        backend = self._backend
        assert backend is not None
        result: Awaitable[None] | None = None
        started = time.monotonic_ns()
        if live:
            try:
                result = backend.execute(live)
            except BaseException as exc:
                _fail_batch(live, self.info.model_name, exc)
        if result is None or not inspect.isawaitable(result):
            elapsed = time.monotonic_ns() - started if live else -1
            self._loop.call_soon_threadsafe(self._on_done, self, batch, elapsed, [])
            return
        task = asyncio.ensure_future(result)
        if backend.decoupled:
            # Decoupled coroutines overlap: the instance takes the next batch at once.
            self._loop.call_soon_threadsafe(
                self._on_done, self, batch, time.monotonic_ns() - started, [])
            task.add_done_callback(lambda t: _log_task_error(t, live, self.info.model_name))
        else:
            task.add_done_callback(lambda t: self._async_done(t, batch, live, started))

    def _async_done(self, task: asyncio.Future[None], batch: list[AdmittedRequest],
                    live: list[AdmittedRequest], started: int) -> None:
        _log_task_error(task, live, self.info.model_name)
        elapsed = time.monotonic_ns() - started
        self._loop.call_soon_threadsafe(self._on_done, self, batch, elapsed, [])

    def _finalize(self) -> None:
        if self._backend is None:
            return
        self._placement.release()
        try:
            self._backend.finalize()
        except BaseException:
            log.exception("finalize() of instance %s failed", self.name)

    def _report(self, future: asyncio.Future[None], exc: BaseException | None) -> None:
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(settle, future, exc)


def run_model_loop(model_loop: asyncio.AbstractEventLoop) -> None:
    """Run an ``async def execute`` model's own loop until stopped, give the tasks still
    running (decoupled coroutines) a few seconds to end, and close it."""
    try:
        model_loop.run_forever()
        pending = asyncio.all_tasks(model_loop)
        if pending:
            model_loop.run_until_complete(asyncio.wait(pending, timeout=5))
    finally:
        model_loop.close()


def settle(future: asyncio.Future[None], outcome: BaseException | None) -> None:
    """Loop only: resolve ``future`` with ``outcome`` (None: success) unless it is done."""
    if future.done():
        return
    if outcome is None:
        future.set_result(None)
    else:
        future.set_exception(outcome)


def _end_unstarted(requests: list[AdmittedRequest]) -> None:
    for request in requests:
        end_unstarted(request)


def end_unstarted(request: AdmittedRequest) -> None:
    """Loop only: end the stream of a request cancelled before its execute began.

    A client's request was ended by its cancellation already; a model's own (BLS) request
    that was executing is left to the model, so one that never reached it ends here.
    """
    reason = request.cancellation.reason
    if reason is not None:
        request.stream.close_with(InferenceResponse.failure(reason.to_error()))


def _fail_batch(batch: list[AdmittedRequest], model: str, exc: BaseException) -> None:
    error = TritiumError(
        ErrorCode.INTERNAL,
        f"Failed to process the request(s) for model '{model}', message: {exc}",
    )
    for request in batch:
        stream = request.stream
        if not stream.closed:
            stream.send_nowait(InferenceResponse.failure(error))


def _log_task_error(task: asyncio.Future[None], live: list[AdmittedRequest], model: str) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.error("execute() of model '%s' failed: %s", model, exc)
        _fail_batch(live, model, exc)
