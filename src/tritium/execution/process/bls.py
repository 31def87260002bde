"""BLS from an instance process: the child request runs in the server, as a thread
instance's would, and its responses come back over the link.

The server side runs the same code as the thread kind (backends/python/bls.py: ``run_child``
for ``exec``, ``pump`` for ``exec(decoupled=True)``), so refusals, error texts and the
decoupled rules are the same. The child request's cancellation follows the requests the
calling ``execute`` runs (``Cancellation.following``: with several, once all of them are
cancelled), and the call's own cancellation (``ResponseIterator.cancel()``, a cancelled
``async_exec`` future, the instance going away) cancels it too. Tensors travel as buffers
(wire.py), never through the codec.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

from tritium.backends.python import bls as backend_bls
from tritium.backends.python.bls import ResponseIterator
from tritium.backends.python.response import InferenceResponse, from_core
from tritium.core.cancellation import Cancellation, CancelReason
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.response import InferenceResponse as CoreResponse
from tritium.execution.process.codec import convert
from tritium.execution.process.control import service_of
from tritium.execution.process.messages import BlsRequest
from tritium.execution.process.wire import (
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)

if TYPE_CHECKING:
    import asyncio  # the child imports it only for an async model's calls

    from tritium.backends.python.request import InferenceRequest
    from tritium.execution.process.calls import (
        Call,
        CallContext,
        CallReply,
        ChildLink,
        Handler,
    )

EXEC = "bls.exec"
STREAM = "bls.stream"


# -- in the server -------------------------------------------------------------------


def _child_cancellation(ctx: CallContext, loop: asyncio.AbstractEventLoop
                        ) -> tuple[Cancellation, Any]:
    """The child's cancellation, and the callback that ties it to the call's."""
    parents = [parent.cancellation for parent in ctx.parents]
    child = Cancellation.following(loop, parents, CancelReason.PARENT_CANCELLED)

    def on_call_cancelled(call: Cancellation) -> None:
        if call.reason is CancelReason.CLIENT_CANCELLED:
            # The caller cancelled (ResponseIterator.cancel(), a cancelled async_exec): as in
            # process, it still reads what the child sends until the child ends.
            child.cancel(CancelReason.CLIENT_CANCELLED)
        else:
            # The instance process is gone: nobody reads, so the child's stream ends now.
            child.cancel(CancelReason.PARENT_CANCELLED)

    ctx.cancellation.add_callback(on_call_cancelled)
    return child, on_call_cancelled


async def serve_exec(ctx: CallContext, payload: Any, buffers: list[memoryview]) -> None:
    service = service_of(ctx)
    sent: BlsRequest = convert(BlsRequest, payload)
    child = decode_request(sent, buffers)
    child.trace = _parent_trace(ctx, sent.trace_slot)
    cancellation, tie = _child_cancellation(ctx, service.loop)
    try:
        response = await backend_bls.run_child(service, child, cancellation)
    finally:
        ctx.cancellation.remove_callback(tie)
    _reply(ctx, response)


def _parent_trace(ctx: CallContext, slot: int | None) -> Any:
    """The trace of the request whose ``request.trace()`` the child passed, if traced."""
    parent = None if slot is None else ctx.instance.request_in(slot)
    return None if parent is None else parent.request.trace


class _Replies:
    """backend_bls.ResponseSink sending each response to the child as it comes."""

    def __init__(self, ctx: CallContext):
        self.ctx = ctx
        self.ended = False

    def put(self, response: CoreResponse) -> None:
        if not self.ended:
            self.ended = response.final
            _reply(self.ctx, response)


async def serve_stream(ctx: CallContext, payload: Any, buffers: list[memoryview]) -> None:
    service = service_of(ctx)
    sent: BlsRequest = convert(BlsRequest, payload)
    child = decode_request(sent, buffers)
    child.trace = _parent_trace(ctx, sent.trace_slot)
    cancellation, tie = _child_cancellation(ctx, service.loop)
    replies = _Replies(ctx)
    try:
        await backend_bls.pump(service, child, cancellation, replies)
    finally:
        ctx.cancellation.remove_callback(tie)
        if not replies.ended:  # the reader must not wait for a FINAL that never comes
            replies.put(CoreResponse.failure(CancelReason.SHUTDOWN.to_error()))


def _reply(ctx: CallContext, response: CoreResponse) -> None:
    body, buffers = encode_response(response)
    ctx.reply(body, buffers, final=response.final)


HANDLERS: dict[str, Handler] = {EXEC: serve_exec, STREAM: serve_stream}


# -- in the instance process -----------------------------------------------------------


def _failure(exc: Exception) -> CoreResponse:
    """A link failure as the error response a BLS caller reads (exec never raises)."""
    if isinstance(exc, TritiumError):
        return CoreResponse.failure(exc)
    return CoreResponse.failure(TritiumError(ErrorCode.INTERNAL, f"BLS request failed: {exc}"))


def _response(reply: CallReply) -> CoreResponse:
    return decode_response(reply.payload, reply.buffers)


class RemoteBls:
    """The BLS half of the remote server link (remote.py)."""

    def __init__(self, link: ChildLink):
        self._link = link

    def _call(self, kind: str, request: InferenceRequest) -> Call:
        payload, buffers = encode_request(backend_bls.child_request(request))
        return self._link.call(kind, payload, buffers)

    def exec_blocking(self, request: InferenceRequest) -> InferenceResponse:
        call = self._call(EXEC, request)
        try:
            return from_core(_response(call.result()))
        except Exception as exc:
            return from_core(_failure(exc))

    def exec_async(self, request: InferenceRequest) -> asyncio.Future[Any]:
        import asyncio

        loop = asyncio.get_running_loop()  # raises before the child is sent, as in process
        return loop.create_task(_await_single(self._call(EXEC, request)))

    def exec_decoupled(self, request: InferenceRequest) -> ResponseIterator:
        call = self._call(STREAM, request)
        return ResponseIterator(_CallCancel(call), CallResponses(call))


async def _await_single(call: Call) -> InferenceResponse:
    import asyncio

    try:
        reply = await call.async_result()
    except asyncio.CancelledError:
        call.cancel()  # the future's cancel cancels the child, as in process
        raise
    except Exception as exc:
        return from_core(_failure(exc))
    return from_core(_response(reply))


class _CallCancel:
    """What ResponseIterator cancels: the call, and with it the child in the server."""

    def __init__(self, call: Call):
        self._call = call

    def cancel(self, reason: CancelReason) -> bool:
        with contextlib.suppress(Exception):  # also called from __del__, at any time
            self._call.cancel()
        return True


class CallResponses:
    """backend_bls.ResponseSource over a call's replies: one reader, blocking or async."""

    def __init__(self, call: Call):
        self._call = call
        self._ready: collections.deque[CoreResponse] = collections.deque()
        self._sync: Iterator[CallReply] | None = None
        self._async: AsyncIterator[CallReply] | None = None
        self._ended = False

    def get(self) -> CoreResponse:
        if self._ready:
            return self._ready.popleft()
        if self._sync is None:
            self._sync = iter(self._call.replies())
        try:
            return self._take(next(self._sync))
        except Exception as exc:  # StopIteration included: the link ended the call early
            return self._end(exc)

    async def wait_nonempty(self) -> None:
        if self._ready or self._ended:
            return
        if self._async is None:
            self._async = aiter(self._call.async_replies())
        try:
            self._ready.append(self._take(await anext(self._async)))
        except Exception as exc:
            self._ready.append(self._end(exc))

    def _take(self, reply: CallReply) -> CoreResponse:
        response = _response(reply)
        self._ended = response.final
        return response

    def _end(self, exc: Exception) -> CoreResponse:
        self._ended = True
        if isinstance(exc, StopIteration | StopAsyncIteration):
            exc = TritiumError(ErrorCode.INTERNAL, "BLS response stream ended without FINAL")
        return _failure(exc)

