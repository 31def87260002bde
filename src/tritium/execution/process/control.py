"""``pb_utils.load_model``, ``unload_model`` and ``is_model_ready`` from an instance
process: the server's own repository calls, run on the server loop.

The arguments and the phase are checked in the child by the same code as the thread kind
(backends/python/model_control.py); refusals come back as the server's error, which the
child raises with Triton's prefix (the call's error: one shape, messages.ErrorBody).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tritium.execution.process.codec import convert
from tritium.execution.process.messages import ModelCall, ModelReadyCall

if TYPE_CHECKING:
    from tritium.core.service import InferenceService
    from tritium.execution.process.calls import CallContext, ChildLink, Handler

LOAD = "control.load"
UNLOAD = "control.unload"
READY = "control.ready"


def service_of(ctx: CallContext) -> InferenceService:
    service: InferenceService = ctx.instance.service
    return service


# A refusal raises TritiumError, which crosses as the call's error (ReplyError).
async def serve_load(ctx: CallContext, payload: Any, buffers: list[memoryview]) -> None:
    sent: ModelCall = convert(ModelCall, payload)
    await service_of(ctx).load_model(sent.name, sent.parameters)
    ctx.reply(None, final=True)


async def serve_unload(ctx: CallContext, payload: Any, buffers: list[memoryview]) -> None:
    sent: ModelCall = convert(ModelCall, payload)
    await service_of(ctx).unload_model(sent.name, sent.parameters)
    ctx.reply(None, final=True)


async def serve_ready(ctx: CallContext, payload: Any, buffers: list[memoryview]) -> None:
    sent: ModelReadyCall = convert(ModelReadyCall, payload)
    ctx.reply(service_of(ctx).model(sent.name, sent.version).is_ready(), final=True)


HANDLERS: dict[str, Handler] = {LOAD: serve_load, UNLOAD: serve_unload, READY: serve_ready}


class RemoteControl:
    """The model control half of the remote server link; each call waits for the server."""

    def __init__(self, link: ChildLink):
        self._link = link

    def _call(self, kind: str, payload: object) -> Any:
        return self._link.call(kind, payload).result().payload

    def load_model(self, name: str, parameters: dict[str, Any]) -> None:
        self._call(LOAD, ModelCall(name, parameters))

    def unload_model(self, name: str, parameters: dict[str, Any]) -> None:
        self._call(UNLOAD, ModelCall(name, parameters))

    def is_model_ready(self, name: str, version: int | None) -> bool:
        ready: bool = convert(bool, self._call(READY, ModelReadyCall(name, version)))
        return ready

