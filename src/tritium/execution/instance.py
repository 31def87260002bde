"""A model instance: the thread that runs model code, and the only bridge between the
server's event loop and that code.

The loop hands a batch over with ``submit`` (a SimpleQueue put); the thread runs it through
the batch runner and reports back with one ``call_soon_threadsafe``. A backend whose
``execute`` is a coroutine gets an event loop of its own, run by this thread.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable

from tritium.core.request import AdmittedRequest
from tritium.core.response import InferenceResponse, ResponseStream
from tritium.execution import forks
from tritium.execution.backend import InstanceInfo, ModelBackend
from tritium.execution.kinds import DoneCallback, InstanceSpec
from tritium.execution.placement import ThreadPlacement, current
from tritium.execution.runner import BatchRunner, run_model_loop

log = logging.getLogger("tritium.execution")

BackendFactory = Callable[[InstanceInfo], ModelBackend]

_STOP = None


def build(spec: InstanceSpec) -> ThreadInstance:
    """The thread kind: model code runs on a thread of the server, reaching the server
    through the link in this process."""
    def create(info: InstanceInfo) -> ModelBackend:
        return spec.create_backend(info, spec.config, spec.link)

    forks.install()  # model code shares this process: its forks must not carry the server

    return ThreadInstance(spec.info, create, spec.loop, spec.on_done)


class ThreadInstance:
    """``kinds.Instance`` on a thread of the server: never restarted, ready once started."""

    kind = "thread"
    depth = 1  # the loop hands a thread its next batch at no cost: nothing to save
    ready = True
    restarts = 0
    failure = None  # a thread instance that failed never started: its load failed

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
        self._runner: BatchRunner[list[AdmittedRequest]] | None = None
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
            backend = self._create_backend(self.info)
        except BaseException as exc:
            self._report(self._started, exc)
            self._report(self._stopped, None)
            return
        self._runner = BatchRunner(backend, self.info.model_name, self._batch_done,
                                   self._placement)
        if getattr(backend, "is_async", False):
            self._model_loop = asyncio.new_event_loop()
        self._report(self._started, None)
        try:
            if self._model_loop is not None:
                asyncio.set_event_loop(self._model_loop)
                run_model_loop(self._model_loop)
            else:
                self._serve()
        finally:
            self._finalize(backend)
            self._report(self._stopped, None)

    def _serve(self) -> None:
        inbox, runner = self._inbox, self._runner
        assert runner is not None
        self._placement.settle()
        while (batch := inbox.get()) is not _STOP:
            # Checked again here: a request cancelled after dispatch never reaches the model.
            runner.run(batch, self._live(batch))

    def _start_async(self, batch: list[AdmittedRequest]) -> None:
        assert self._runner is not None
        self._runner.start_async(batch, self._live(batch))

    def _batch_done(self, batch: list[AdmittedRequest], elapsed: int,
                    woken: list[ResponseStream]) -> None:
        self._loop.call_soon_threadsafe(self._on_done, self, batch, elapsed, woken)

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

    def _finalize(self, backend: ModelBackend) -> None:
        self._placement.release()
        try:
            backend.finalize()
        except BaseException:
            log.exception("finalize() of instance %s failed", self.name)

    def _report(self, future: asyncio.Future[None], exc: BaseException | None) -> None:
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(settle, future, exc)


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
