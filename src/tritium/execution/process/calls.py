"""Calls model code in an instance process makes back into the server: their kinds, the
handlers that serve them on the server loop.

Model code in the child reaches the server only through its server link (remote.py): BLS,
custom metrics, ``pb_utils.Logger`` and the model loading API become calls of a kind named
here, served by the parent with the same code the thread kind runs in process, so a model
behaves the same under both kinds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tritium.core.cancellation import Cancellation
from tritium.core.request import AdmittedRequest


@dataclass(frozen=True, slots=True)
class CallReply:
    """One reply to a call, as the child reads it: its payload (plain values, as decoded:
    the reader ``convert``s it to the type it expects), its tensors' bytes (views of the
    server's arena), and whether it is the last."""

    payload: Any
    buffers: list[memoryview]
    final: bool


class Call(Protocol):
    """One call the child made: its replies, read blocking or on an asyncio loop."""

    def replies(self) -> Iterator[CallReply]: ...

    def result(self) -> CallReply:
        """The final reply."""
        ...

    def cancel(self) -> None: ...

    def async_replies(self) -> AsyncIterator[CallReply]: ...

    async def async_result(self) -> CallReply: ...


class ChildLink(Protocol):
    """The child's end of its channel to the parent (thread-safe)."""

    def call(self, kind: str, payload: object, buffers: Sequence[memoryview] = ()) -> Call: ...


class CallContext(Protocol):
    """What a parent-side handler gets besides the call's payload and buffers."""

    @property
    def cancellation(self) -> Cancellation: ...

    @property
    def instance(self) -> Any: ...

    @property
    def parents(self) -> Sequence[AdmittedRequest]: ...

    def reply(self, payload: object, buffers: Sequence[memoryview] = (),
              final: bool = False) -> None: ...


Handler = Callable[[CallContext, Any, list[memoryview]], Awaitable[None]]


def _handlers() -> dict[str, Handler]:
    # Imported here: the handler modules name these types, and this module names them.
    from tritium.execution.process import bls, control, logger, metrics

    return {**bls.HANDLERS, **metrics.HANDLERS, **logger.HANDLERS, **control.HANDLERS}


HANDLERS: dict[str, Handler] = _handlers()
