"""The server link of model code in an instance process: every call crosses the channel
to the server, which serves it with the same code a thread instance's ``LocalLink`` runs
(the handlers of bls.py, control.py and metrics.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tritium.execution.process.bls import RemoteBls
from tritium.execution.process.control import RemoteControl
from tritium.execution.process.metrics import RemoteFamilies

if TYPE_CHECKING:
    import asyncio

    from tritium.backends.python.bls import ResponseIterator
    from tritium.backends.python.metric import Family, MetricKind
    from tritium.backends.python.request import InferenceRequest
    from tritium.backends.python.response import InferenceResponse
    from tritium.execution.process.calls import ChildLink


class RemoteLink:
    """``backends.python.link.ServerLink`` over an instance process's channel."""

    def __init__(self, link: ChildLink) -> None:
        self.rebind(link)

    def rebind(self, link: ChildLink) -> None:
        """Go through ``link`` from now on (a fork of the model gets a link of its own)."""
        self._bls = RemoteBls(link)
        self._control = RemoteControl(link)
        self._families = RemoteFamilies(link)

    def exec_blocking(self, request: InferenceRequest) -> InferenceResponse:
        return self._bls.exec_blocking(request)

    def exec_async(self, request: InferenceRequest) -> asyncio.Future[Any]:
        return self._bls.exec_async(request)

    def exec_decoupled(self, request: InferenceRequest) -> ResponseIterator:
        return self._bls.exec_decoupled(request)

    def load_model(self, name: str, parameters: dict[str, Any]) -> None:
        self._control.load_model(name, parameters)

    def unload_model(self, name: str, parameters: dict[str, Any]) -> None:
        self._control.unload_model(name, parameters)

    def is_model_ready(self, name: str, version: int | None) -> bool:
        return self._control.is_model_ready(name, version)

    def metric_family(self, name: str, description: str, kind: MetricKind) -> Family:
        return self._families.family(name, description, kind)
