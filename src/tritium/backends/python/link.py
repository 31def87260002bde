"""The server link: the one object through which model code reaches the server.

BLS, the model loading API and custom metrics all go through the ``ServerLink`` the
backend was created with: ``LocalLink`` when the model runs in the server's own process
(a thread instance), a remote link over the instance's channel when it runs in a process
of its own (``execution.process.remote``). ``pb_utils`` finds it through the execution
scope (backends/python/scope.py), never through a module global set by an instance kind.
Model control raises ``TritiumError`` (the server's own error); ``model_control`` gives it
Triton's prefix.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from tritium.core.cancellation import running_loop
from tritium.core.errors import ErrorCode, TritiumError

if TYPE_CHECKING:
    import asyncio

    from tritium.backends.python.bls import ResponseIterator
    from tritium.backends.python.metric import Family, MetricKind
    from tritium.backends.python.request import InferenceRequest
    from tritium.backends.python.response import InferenceResponse
    from tritium.core.service import InferenceService

T = TypeVar("T")


class ServerLink(Protocol):
    """What model code asks of the server. Every method is called from model code (an
    instance thread, a model's own event loop, a thread the model started)."""

    def exec_blocking(self, request: InferenceRequest) -> InferenceResponse: ...

    def exec_async(self, request: InferenceRequest) -> asyncio.Future[Any]: ...

    def exec_decoupled(self, request: InferenceRequest) -> ResponseIterator: ...

    def load_model(self, name: str, parameters: dict[str, Any]) -> None: ...

    def unload_model(self, name: str, parameters: dict[str, Any]) -> None: ...

    def is_model_ready(self, name: str, version: int | None) -> bool: ...

    def metric_family(self, name: str, description: str, kind: MetricKind) -> Family: ...


class LocalLink:
    """``ServerLink`` in the server's own process: work is handed to the server loop."""

    def __init__(self, service: InferenceService) -> None:
        self.service = service

    # -- BLS -----------------------------------------------------------------
    def exec_blocking(self, request: InferenceRequest) -> InferenceResponse:
        from tritium.backends.python import bls

        return bls.run_blocking(self.service, request)

    def exec_async(self, request: InferenceRequest) -> asyncio.Future[Any]:
        from tritium.backends.python import bls

        return bls.run_async(self.service, request)

    def exec_decoupled(self, request: InferenceRequest) -> ResponseIterator:
        from tritium.backends.python import bls

        return bls.run_decoupled(self.service, request)

    # -- model control -------------------------------------------------------
    def load_model(self, name: str, parameters: dict[str, Any]) -> None:
        self._wait(self.service.load_model(name, parameters))

    def unload_model(self, name: str, parameters: dict[str, Any]) -> None:
        self._wait(self.service.unload_model(name, parameters))

    def is_model_ready(self, name: str, version: int | None) -> bool:
        return self.service.model(name, version).is_ready()

    def _wait(self, work: Coroutine[Any, Any, T]) -> T:
        import asyncio

        if running_loop() is self.service.loop:
            work.close()
            raise TritiumError(ErrorCode.INTERNAL, "cannot wait on the server's event loop")
        return asyncio.run_coroutine_threadsafe(work, self.service.loop).result()

    # -- metrics -------------------------------------------------------------
    def metric_family(self, name: str, description: str, kind: MetricKind) -> Family:
        from tritium.backends.python.metric import MetricFamily

        return MetricFamily.register_here(name, description, kind)
