"""BLS: a model's own inference requests, run through the same core as a client's.

Children are submitted and read on the server loop (``service.loop``); the model's
thread only waits on a future or a queue. A child's cancellation follows its parents
(the requests the calling ``execute`` is running): with several parents, once all of
them are cancelled.
"""

from __future__ import annotations

import collections
import threading
from typing import TYPE_CHECKING, Any, Protocol

from tritium.backends.python import scope
from tritium.backends.python.errors import TritonModelException
from tritium.backends.python.response import InferenceResponse, from_core
from tritium.core import messages
from tritium.core.cancellation import Cancellation, CancelReason, running_loop
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.request import InferenceRequest as CoreRequest
from tritium.core.request import RequestedOutput
from tritium.core.response import InferenceResponse as CoreResponse
from tritium.core.response import ResponseStream
from tritium.core.types import Tensor as CoreTensor

# asyncio is imported where it is used: an instance process of a sync model never needs it.
if TYPE_CHECKING:
    import asyncio

    from tritium.backends.python.link import ServerLink
    from tritium.backends.python.request import InferenceRequest
    from tritium.core.service import InferenceService


def exec_blocking(request: InferenceRequest) -> InferenceResponse:
    """``request.exec()``: wait on the calling thread for the child's one response."""
    return _link().exec_blocking(request)


def exec_async(request: InferenceRequest) -> asyncio.Future[Any]:
    """``request.async_exec()``: the same, awaited on the caller's running loop.

    Cancelling the returned future cancels the child request.
    """
    import asyncio

    asyncio.get_running_loop()  # raises before any child is sent, as Triton's does
    return _link().exec_async(request)


def exec_decoupled(request: InferenceRequest) -> ResponseIterator:
    """``request.exec(decoupled=True)``: responses arrive on an iterator as they come."""
    return _link().exec_decoupled(request)


def _link() -> ServerLink:
    _check_phase()
    link = scope.current_link()
    if link is None:
        raise TritonModelException("BLS requests need a running tritium server")
    return link


# -- in the server's process (backends.python.link.LocalLink) ----------------------


def run_blocking(service: InferenceService, request: InferenceRequest) -> InferenceResponse:
    import asyncio

    child, cancellation = _start(service, request)
    if running_loop() is service.loop:
        cancellation.detach()
        raise TritonModelException("BLS exec() cannot block the server's event loop")
    future = asyncio.run_coroutine_threadsafe(
        _run_single(service, child, cancellation), service.loop)
    return future.result()


def run_async(service: InferenceService, request: InferenceRequest) -> asyncio.Future[Any]:
    import asyncio

    caller_loop = asyncio.get_running_loop()
    child, cancellation = _start(service, request)
    future = asyncio.run_coroutine_threadsafe(
        _run_single(service, child, cancellation), service.loop)
    return asyncio.wrap_future(future, loop=caller_loop)


def run_decoupled(service: InferenceService, request: InferenceRequest) -> ResponseIterator:
    import asyncio

    child, cancellation = _start(service, request)
    sink = ResponseBuffer()
    asyncio.run_coroutine_threadsafe(pump(service, child, cancellation, sink), service.loop)
    return ResponseIterator(cancellation, sink)


def exec_decoupled_async(request: InferenceRequest) -> asyncio.Future[ResponseIterator]:
    """``request.async_exec(decoupled=True)``: the iterator, once the first response came.

    As in Triton, where the call waits for the first response in an executor: awaiting
    it lets the loop run other coroutines meanwhile (their own BLS calls included),
    and a plain ``for`` over a child that already finished never blocks the loop.
    """
    import asyncio

    loop = asyncio.get_running_loop()  # raises before any child is sent, as Triton's does
    iterator = exec_decoupled(request)
    return loop.create_task(iterator.wait_first())


class ResponseBuffer:
    """A child's responses: put on the server loop, taken by a model thread that blocks
    or awaited on a model's own event loop (one reader at a time)."""

    def __init__(self) -> None:
        self._ready = threading.Condition()
        self._items: collections.deque[CoreResponse] = collections.deque()
        self._waiters: list[asyncio.Future[None]] = []

    def put(self, response: CoreResponse) -> None:
        with self._ready:
            self._items.append(response)
            self._ready.notify_all()
            waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            loop = waiter.get_loop()
            if not loop.is_closed():
                loop.call_soon_threadsafe(_wake, waiter)

    def get(self) -> CoreResponse:
        """The next response, blocking the calling thread until there is one."""
        with self._ready:
            self._ready.wait_for(lambda: self._items)
            return self._items.popleft()

    async def wait_nonempty(self) -> None:
        """Return once a response can be taken without blocking."""
        import asyncio

        loop = asyncio.get_running_loop()
        while True:
            with self._ready:
                if self._items:
                    return
                waiter = loop.create_future()
                self._waiters.append(waiter)
            await waiter


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class ResponseSource(Protocol):
    """Where a ResponseIterator takes a child's responses from (one reader at a time)."""

    def get(self) -> CoreResponse: ...

    async def wait_nonempty(self) -> None: ...


class Cancellable(Protocol):
    def cancel(self, reason: CancelReason) -> bool: ...


class ResponseIterator:
    """The responses of a decoupled BLS call, ending after the FINAL one.

    A flag-only FINAL is yielded as a response without outputs, as Triton does. Like
    Triton's, iterating again after the end replays the responses. Besides Triton's
    blocking ``for``, ``async for`` awaits each response without blocking the loop.
    """

    def __init__(self, cancellation: Cancellable, sink: ResponseSource):
        self._cancellation = cancellation
        self._sink = sink
        self._seen: list[InferenceResponse] = []
        self._index = 0
        self._finished = False

    def __iter__(self) -> ResponseIterator:
        if self._finished and self._index >= len(self._seen):
            self._index = 0
        return self

    def __aiter__(self) -> ResponseIterator:
        return self.__iter__()

    async def __anext__(self) -> InferenceResponse:
        if not self._finished:
            await self._sink.wait_nonempty()
        try:
            return self.__next__()
        except StopIteration:
            raise StopAsyncIteration from None

    async def wait_first(self) -> ResponseIterator:
        """This iterator, once its first response can be read without blocking."""
        import asyncio

        try:
            await self._sink.wait_nonempty()
        except asyncio.CancelledError:
            self.cancel()
            raise
        return self

    def __next__(self) -> InferenceResponse:
        if self._finished:
            if self._index < len(self._seen):
                self._index += 1
                return self._seen[self._index - 1]
            raise StopIteration
        core = self._sink.get()
        response = from_core(core)
        self._seen.append(response)
        if core.final:
            self._finished = True
            self._index = len(self._seen)
        return response

    def cancel(self) -> None:
        """Cancel the child request; a no-op once its last response arrived."""
        if not self._finished:
            self._cancellation.cancel(CancelReason.CLIENT_CANCELLED)

    def __del__(self) -> None:
        # Nobody can read the rest any more, so the child's work is not wanted.
        # (Triton instead blocks here until the child finishes.)
        if not self._finished:
            self._cancellation.cancel(CancelReason.CLIENT_CANCELLED)


def _check_phase() -> None:
    phase = scope.current_phase()
    if phase is not None and phase is not scope.Phase.EXECUTE:
        # Triton's stub refuses BLS until initialize() has returned and once finalizing.
        raise TritonModelException("BLS is only supported during the 'execute' function.")


def _start(service: InferenceService, request: InferenceRequest
           ) -> tuple[CoreRequest, Cancellation]:
    parents = [parent.cancellation for parent in scope.current_parents()]
    cancellation = Cancellation.following(service.loop, parents, CancelReason.PARENT_CANCELLED)
    return child_request(request), cancellation


def child_request(request: InferenceRequest) -> CoreRequest:
    """The core request a BLS ``InferenceRequest`` stands for (no tensor data copied)."""
    inputs: dict[str, CoreTensor] = {}
    for tensor in request._inputs:
        core = tensor._core
        # A fresh core Tensor: the core may reshape it, and the caller's must not change.
        inputs[core.name] = CoreTensor(core.name, core.datatype, core.shape, core.data)
    names = request._requested_output_names
    return CoreRequest(
        model_name=request._model_name,
        inputs=inputs,
        model_version=None if request._model_version < 0 else request._model_version,
        id=request._request_id,
        requested_outputs=[RequestedOutput(name) for name in names] if names else None,
        parameters=dict(request._parameters),
        correlation_id=request._correlation_id,
        flags=request._flags,
        timeout_us=request._timeout,
        trace=request._trace._core,  # set by the model (trace=request.trace()): nested
    )


# -- on the server loop ----------------------------------------------------------------


async def _run_single(
    service: InferenceService, child: CoreRequest, cancellation: Cancellation
) -> InferenceResponse:
    return from_core(await run_child(service, child, cancellation))


async def run_child(
    service: InferenceService, child: CoreRequest, cancellation: Cancellation
) -> CoreResponse:
    """The one response of a non-decoupled child (an error response when it failed)."""
    import asyncio

    try:
        stream = _submit(service, child, cancellation, allow_decoupled=False)
        return await _collect_single(stream)
    except TritiumError as exc:
        return CoreResponse.failure(exc)
    except asyncio.CancelledError:
        cancellation.cancel(CancelReason.CLIENT_CANCELLED)
        raise
    finally:
        cancellation.detach()


async def _collect_single(stream: ResponseStream) -> CoreResponse:
    result: CoreResponse | None = None
    async for response in stream:
        if response.error is not None:
            return response
        if not response.flag_only:
            result = response
    if result is None:
        empty = TritiumError(ErrorCode.INTERNAL, "Unexpected empty response.")
        return CoreResponse.failure(empty)
    return result


class ResponseSink(Protocol):
    def put(self, response: CoreResponse) -> None: ...


async def pump(
    service: InferenceService,
    child: CoreRequest,
    cancellation: Cancellation,
    sink: ResponseSink,
) -> None:
    """Run a decoupled child, putting each of its responses into ``sink`` as it comes."""
    import asyncio

    try:
        stream = _submit(service, child, cancellation, allow_decoupled=True)
        async for response in stream:
            sink.put(response)
    except TritiumError as exc:
        sink.put(CoreResponse.failure(exc))
    except asyncio.CancelledError:
        # The server loop is going away; the reader must not wait forever.
        cancellation.cancel(CancelReason.SHUTDOWN)
        sink.put(CoreResponse.failure(CancelReason.SHUTDOWN.to_error()))
        raise
    finally:
        cancellation.detach()


def _submit(service: InferenceService, child: CoreRequest, cancellation: Cancellation,
            allow_decoupled: bool) -> ResponseStream:
    """The child's response stream; a refusal names the model, as Triton's BLS does."""
    try:
        if not allow_decoupled and service.model(child.model_name,
                                                 child.model_version).decoupled:
            raise TritiumError(ErrorCode.UNSUPPORTED,
                               messages.BLS_DECOUPLED_ON_EXEC.format(model=child.model_name))
        return service.submit(child, cancellation, allow_decoupled=allow_decoupled,
                              internal=True)
    except TritiumError as exc:
        raise TritiumError(exc.code, messages.BLS_SUBMIT_FAILED.format(
            model=child.model_name, reason=exc.message)) from exc
