"""The interface between an execution instance and the model code it runs."""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Protocol

from tritium.core.request import AdmittedRequest


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    """What Triton tells a model instance about itself in ``initialize(args)``."""

    model_name: str
    model_version: int
    model_repository: str  # the model's directory, <repo>/<model>
    config_json: str  # the completed ModelConfig, as HTTP /config prints it
    instance_name: str  # <model>_<group index>_<instance index>
    kind: str  # "CPU" | "GPU" | "MODEL"
    device_id: int


class ModelBackend(Protocol):
    """One instance of model code. Every method runs on the instance's own thread.

    ``execute`` must deliver each request's responses through ``request.stream``
    (``send_nowait``), ending with a response whose ``final`` is True. A model that is
    not decoupled delivers them before ``execute`` returns; a decoupled one may deliver
    them later from any thread. ``execute`` never raises: model errors become error
    responses of the requests of that call.
    """

    decoupled: bool

    def execute(self, requests: list[AdmittedRequest]) -> Awaitable[None] | None:
        """Run one batch. Returns an awaitable when the model's ``execute`` is a
        coroutine; the instance then runs it on its own event loop."""

    def finalize(self) -> None: ...
