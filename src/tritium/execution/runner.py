"""The batch runner: runs batches through one backend for any instance kind.

``run`` calls a synchronous ``execute`` on the calling thread; ``start_async`` starts an
``async def execute`` on the instance's own event loop (decoupled coroutines overlap: the
instance takes the next batch at once). Either way an exception becomes Triton's "Failed
to process the request(s)" response for each request still open, and the batch is reported
done through ``report``, the one thing that differs between kinds (a thread instance hands
it to the server loop, a process sends it over its channel).
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.response import InferenceResponse, ResponseStream, wakes
from tritium.execution.backend import ModelBackend
from tritium.execution.placement import ThreadPlacement

if TYPE_CHECKING:
    import asyncio  # imported by the async paths only: a sync model's process never needs it

log = logging.getLogger("tritium.execution")

Token = TypeVar("Token")
# (the batch's token, nanoseconds execute took or -1 when it did not run, the streams whose
# wake-ups were held back while it ran: see core.response.wakes)
Report = Callable[[Token, int, list[ResponseStream]], None]


class BatchRunner(Generic[Token]):
    def __init__(self, backend: ModelBackend, model_name: str, report: Report[Token],
                 placement: ThreadPlacement) -> None:
        self.backend = backend
        self._model = model_name
        self._report = report
        self._placement = placement
        self._placed = placement.active  # not placed (an instance process): nothing to call

    def run(self, token: Token, requests: Sequence[Any]) -> None:
        """A synchronous ``execute`` of ``requests`` on this thread; reported when done."""
        if not requests:
            self._report(token, -1, [])
            return
        started = time.monotonic_ns()
        if self._placed:
            self._placement.widen()
        # The responses execute returns wake when the report says (core.response.wakes).
        woken: list[ResponseStream] = []
        wakes.deferred = woken
        try:
            self.backend.execute(list(requests))
        except BaseException as exc:  # the backend never raises; belt and braces
            fail_batch(requests, self._model, exc)
        finally:
            wakes.deferred = None
        elapsed = time.monotonic_ns() - started
        # Home before waking the loop, so the wake-up stays on one core.
        if self._placed:
            self._placement.narrow()
        self._report(token, elapsed, woken)

    def start_async(self, token: Token, requests: Sequence[Any]) -> None:
        """On the instance's model loop: start ``execute``; reported when it returns (a
        decoupled coroutine: once started)."""
        started = time.monotonic_ns()
        result: Awaitable[None] | None = None
        if requests:
            try:
                result = self.backend.execute(list(requests))
            except BaseException as exc:
                fail_batch(requests, self._model, exc)
        if result is None or not inspect.isawaitable(result):
            self._report(token, time.monotonic_ns() - started if requests else -1, [])
            return
        import asyncio

        task = asyncio.ensure_future(result)
        if self.backend.decoupled:
            self._report(token, time.monotonic_ns() - started, [])
            task.add_done_callback(lambda t: self._task_error(t, requests))
        else:
            task.add_done_callback(lambda t: self._async_done(t, token, requests, started))

    def _async_done(self, task: asyncio.Future[None], token: Token, requests: Sequence[Any],
                    started: int) -> None:
        self._task_error(task, requests)
        self._report(token, time.monotonic_ns() - started, [])

    def _task_error(self, task: asyncio.Future[None], requests: Sequence[Any]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("execute() of model '%s' failed: %s", self._model, exc)
            fail_batch(requests, self._model, exc)


def fail_batch(requests: Sequence[Any], model: str, exc: BaseException) -> None:
    """Answer every request of ``requests`` still open with Triton's execute failure."""
    error = TritiumError(
        ErrorCode.INTERNAL,
        f"Failed to process the request(s) for model '{model}', message: {exc}",
    )
    for request in requests:
        stream = request.stream
        if not stream.closed:
            stream.send_nowait(InferenceResponse.failure(error))


def run_model_loop(model_loop: asyncio.AbstractEventLoop) -> None:
    """Run an ``async def execute`` model's own loop until stopped, give the tasks still
    running (decoupled coroutines) a few seconds to end, and close it."""
    import asyncio

    try:
        model_loop.run_forever()
        pending = asyncio.all_tasks(model_loop)
        if pending:
            model_loop.run_until_complete(asyncio.wait(pending, timeout=5))
    finally:
        model_loop.close()
