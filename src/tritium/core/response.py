"""Responses and the channel that carries them from a model to a frontend.

A ``ResponseStream`` has two halves. The send half (``send_nowait``) is called by
model code on any thread; the receive half (``receive``) is awaited by a frontend on
the event loop. A FINAL response closes the stream: later sends are refused, and once
the stream was closed by a cancellation they are dropped quietly.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from tritium.core.cancellation import Cancellation, running_loop
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.types import Tensor

if TYPE_CHECKING:
    import asyncio


@dataclass(frozen=True, slots=True)
class ServedBy:
    """The model version that answers a request: what an encoder echoes as the version
    and classifies outputs with. One per loaded version, shared by its responses."""

    model_name: str
    version: int
    batched: bool  # the model batches: an output's first dimension is the batch
    labels: Mapping[str, Sequence[str]]  # an output's class labels (``label_filename``)


class InferenceResponse(msgspec.Struct):
    """One response of a request. A Struct: made in C, without a Python ``__init__``
    frame, for every response (never encoded by msgspec: the frontends encode it)."""

    outputs: list[Tensor] = msgspec.field(default_factory=list)
    parameters: dict[str, Any] = msgspec.field(default_factory=dict)
    error: TritiumError | None = None
    final: bool = True
    # True for a FINAL flag sent without a response (decoupled models).
    flag_only: bool = False
    # Set as the response enters its request's stream.
    served_by: ServedBy | None = None

    @classmethod
    def final_flag(cls) -> InferenceResponse:
        return cls(final=True, flag_only=True)

    @classmethod
    def failure(cls, error: TritiumError, final: bool = True) -> InferenceResponse:
        return cls(error=error, final=final)


class _ThreadState(threading.local):
    """A thread's wake-up state (``wakes``). Code that delivers many responses at once (the
    batch runner around an ``execute``, the process kind around a DONE) sets ``deferred`` to
    a list, and back to None in a ``finally``: the streams sent to meanwhile are collected
    there, and one hop to the loop wakes them all (``wake_all``) instead of one per response
    (an instance thread makes that hop anyway when ``execute`` returns). What model code
    sends itself wakes at once (``model_scope``). Set directly, not by a context manager:
    it happens for every batch, and a ``with`` costs three Python calls."""

    # A class default: read per response, a plain attribute costs less than getattr.
    deferred: list[ResponseStream] | None = None


wakes = _ThreadState()

# The scope of the model code running in this context (the python backend sets it around
# a model's ``execute``), None outside model code. What model code sends itself is never
# held back: a token of a stream must reach its client now, not when ``execute`` returns.
# A context variable the backend sets anyway, read in C: cheaper than suspending
# ``deferred`` around every execute.
model_scope: ContextVar[Any] = ContextVar("tritium_model_scope", default=None)


def wake_all(streams: list[ResponseStream]) -> None:
    """Loop only: wake the streams ``wakes.deferred`` collected."""
    for stream in streams:
        stream._wake()


class StreamClosedError(TritiumError):
    def __init__(self) -> None:
        super().__init__(ErrorCode.INTERNAL, "Response sender has been closed")


class ResponseStream:
    """Single-producer-at-a-time, single-consumer response channel across threads."""

    # Responses wait here for the loop, holding the model's arrays: what model code sends
    # while it goes on running must be a copy (python backend, sender.py).
    keeps_arrays = True

    __slots__ = (
        "_cancellation",
        "_cancelled",
        "_done_receiving",
        "_items",
        "_loop",
        "_served_by",
        "_waiter",
        "_wake_pending",
        "closed",
        "error",
        "final_response",
        "on_done",
        "on_first",
        "on_late_final",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, cancellation: Cancellation | None = None,
                 served_by: ServedBy | None = None):
        self._loop = loop
        self._served_by = served_by
        # Once it is set, what the model sends is dropped: the client hears the reason
        # (from ``close_with`` on the loop), not the model's reaction to it.
        self._cancellation = cancellation
        self._items: collections.deque[InferenceResponse] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._wake_pending = False
        self.closed = False  # the send half saw FINAL (or a cancellation)
        self._cancelled = False
        self._done_receiving = False
        # Called once on the loop after the final response was sent.
        self.on_done: Callable[[], None] | None = None
        # Called on the loop when the model sends FINAL after a cancellation closed
        # the stream: the moment its work stopped.
        self.on_late_final: Callable[[], None] | None = None
        # Called once, on the sender's thread, as the first response is delivered (the
        # first response histogram); None unless the model's metrics ask for it.
        self.on_first: Callable[[], None] | None = None
        # The last error the stream carried: the request failed if it is set.
        self.error: TritiumError | None = None
        # The response that closed the stream (what the response cache stores).
        self.final_response: InferenceResponse | None = None

    # -- send half (any thread) ------------------------------------------------
    def send_nowait(self, response: InferenceResponse) -> None:
        cancellation = self._cancellation
        if cancellation is not None and cancellation.reason is not None and not self._on_loop():
            self._cancelled = True
        if self.closed or self._cancelled:
            if self._cancelled:
                if response.final and self.on_late_final is not None:
                    late, self.on_late_final = self.on_late_final, None
                    self._call_on_loop(late)
                return
            raise StreamClosedError()
        self._deliver(response)

    def close_with(self, response: InferenceResponse) -> bool:
        """Loop only: end the stream with ``response`` (an error, usually) and drop
        whatever the model sends later. Returns False if it had already ended."""
        self._cancelled = True
        if self.closed:
            return False
        self._deliver(response)
        return True

    def _deliver(self, response: InferenceResponse) -> None:
        if self._served_by is not None:
            response.served_by = self._served_by
        first = self.on_first
        if first is not None:
            self.on_first = None
            first()
        if response.final:
            self.closed = True
            self.final_response = response
        if response.error is not None:
            self.error = response.error
        self._items.append(response)
        if not self._wake_pending:
            self._wake_pending = True
            # Deferred first: the loop defers too while it delivers what an instance
            # process returned, so that on_done decides when those wake (preserve_ordering).
            deferred = wakes.deferred
            if deferred is not None and model_scope.get() is None:
                deferred.append(self)
            elif self._on_loop():
                self._wake()
            else:
                self._loop.call_soon_threadsafe(self._wake)

    # -- receive half (event loop) ---------------------------------------------
    async def receive(self) -> InferenceResponse:
        """The next response; the one with ``final`` set is the last."""
        while not self._items:
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()

    def receive_nowait(self) -> InferenceResponse | None:
        return self._items.popleft() if self._items else None

    def __aiter__(self) -> ResponseStream:
        return self

    async def __anext__(self) -> InferenceResponse:
        if self._done_receiving:
            raise StopAsyncIteration
        response = await self.receive()
        if response.final:
            self._done_receiving = True
        return response

    def _wake(self) -> None:
        self._wake_pending = False
        if self.closed and self.on_done is not None:
            on_done, self.on_done = self.on_done, None
            on_done()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _call_on_loop(self, callback: Callable[[], None]) -> None:
        if self._on_loop():
            callback()
        elif not self._loop.is_closed():
            self._loop.call_soon_threadsafe(callback)

    def _on_loop(self) -> bool:
        return running_loop() is self._loop
