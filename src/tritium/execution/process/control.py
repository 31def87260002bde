"""``pb_utils.load_model``, ``unload_model`` and ``is_model_ready`` from an instance
process: the server's own repository calls, run on the server loop.

The arguments and the phase are checked in the child by the same code as the thread kind
(backends/python/model_control.py); refusals come back as the server's error, which the
child raises with Triton's prefix.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tritium.core.errors import TritiumError
from tritium.core.service import InferenceService
from tritium.execution.process.wire import decode_error, encode_error

if TYPE_CHECKING:
    from tritium.execution.process.calls import CallContext, ChildLink, Handler

LOAD = "control.load"
UNLOAD = "control.unload"
READY = "control.ready"


def service_of(ctx: CallContext) -> InferenceService:
    service: InferenceService = ctx.instance.service
    return service


async def serve_load(ctx: CallContext, payload: Any, buffers: list[memoryview]) -> None:
    name, parameters = payload
    await _answer(ctx, service_of(ctx).load_model(name, parameters))


async def serve_unload(ctx: CallContext, payload: Any, buffers: list[memoryview]) -> None:
    name, parameters = payload
    await _answer(ctx, service_of(ctx).unload_model(name, parameters))


async def serve_ready(ctx: CallContext, payload: Any, buffers: list[memoryview]) -> None:
    name, version = payload
    try:
        ready = service_of(ctx).model(name, version).is_ready()
    except TritiumError as exc:
        ctx.reply((None, encode_error(exc)), final=True)
        return
    ctx.reply((ready, None), final=True)


async def _answer(ctx: CallContext, work: Any) -> None:
    try:
        await work
    except TritiumError as exc:
        ctx.reply((None, encode_error(exc)), final=True)
        return
    ctx.reply((None, None), final=True)


HANDLERS: dict[str, Handler] = {LOAD: serve_load, UNLOAD: serve_unload, READY: serve_ready}


class RemoteControl:
    """The model control half of the remote server link; each call waits for the server."""

    def __init__(self, link: ChildLink):
        self._link = link

    def _call(self, kind: str, payload: object) -> Any:
        (value, error), _ = self._link.call(kind, payload).result()
        failure = decode_error(error)
        if failure is not None:
            raise failure
        return value

    def load_model(self, name: str, parameters: dict[str, Any]) -> None:
        self._call(LOAD, (name, parameters))

    def unload_model(self, name: str, parameters: dict[str, Any]) -> None:
        self._call(UNLOAD, (name, parameters))

    def is_model_ready(self, name: str, version: int | None) -> bool:
        return bool(self._call(READY, (name, version)))

