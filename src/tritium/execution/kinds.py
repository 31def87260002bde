"""The ``Instance`` interface every kind of model instance implements, and the builder that
picks a model's kind and builds its instances.

A kind is one module with a ``build(spec) -> Instance`` function, named in ``KINDS``: the
thread kind (``execution.instance``) and the process kind (``execution.process.launch``)
are two such modules; a third kind is a third module and one line here. Neither the backend
nor a kind decides which kind a model gets: ``InstanceBuilder`` does, for whoever builds
instances (the repository's loaded model).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.request import AdmittedRequest
from tritium.core.response import ResponseStream
from tritium.execution.backend import InstanceInfo, ModelBackend

log = logging.getLogger("tritium.execution")

KIND_PARAMETER = "TRITIUM_INSTANCE_KIND"  # a model's own choice, in its config parameters
ENV_PARAMETER = "EXECUTION_ENV_PATH"  # only a process can run another Python
# kind -> the module whose ``build(spec)`` makes one (imported when first used).
KINDS = {
    "thread": "tritium.execution.instance",
    "process": "tritium.execution.process.launch",
}


class Instance(Protocol):
    """One model instance, of any kind, as the scheduler and the repository use it.

    ``submit`` hands over a batch (loop only, never blocks); the instance reports it done
    through the ``on_done`` it was built with. ``ready`` is False while a kind that restarts
    has no live instance; ``restarts`` counts those restarts (0 for kinds that never do).
    ``depth`` is how many batches it takes before the first is done: more than one lets an
    instance that runs apart from the loop find its next batch waiting (the scheduler still
    prefers a free instance, and the instance runs its batches one at a time).
    """

    info: InstanceInfo
    name: str
    kind: str  # its key in KINDS, for whoever shows instances

    @property
    def depth(self) -> int: ...

    @property
    def ready(self) -> bool: ...

    @property
    def restarts(self) -> int: ...

    @property
    def failure(self) -> TritiumError | None:
        """Why this instance gave up coming back (None while it serves or may)."""

    async def start(self) -> None: ...

    def submit(self, batch: list[AdmittedRequest]) -> None: ...

    def stop(self) -> None: ...

    async def wait_stopped(self) -> None: ...


# (instance, batch, nanoseconds execute took or -1 when it did not run, the streams whose
# responses wait to be woken: the callback must wake them, see core.response.wakes)
DoneCallback = Callable[[Any, list[AdmittedRequest], int, list[ResponseStream]], None]
# Creates and initializes the model code of one instance, given the server link through
# which that code reaches the server (BLS, model control, metrics, logs).
BackendFactory = Callable[[InstanceInfo, Any, Any], ModelBackend]
AutoComplete = Callable[[Path, Any], Any]


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """Everything a kind needs to build one instance."""

    info: InstanceInfo
    config: Any  # the completed ModelConfig
    loop: asyncio.AbstractEventLoop
    on_done: DoneCallback
    create_backend: BackendFactory  # where the model code runs in this process
    link: Any  # the server link model code in this process uses (backends.python.link)
    service: Any  # the InferenceService, for kinds that serve a remote link's calls


class InstanceBuilder:
    """Chooses each model's instance kind and builds its instances."""

    def __init__(self, default_kind: str, create_backend: BackendFactory,
                 auto_complete_here: AutoComplete | None = None) -> None:
        if default_kind not in KINDS:
            raise ValueError(f"instance kind must be one of {', '.join(KINDS)}: "
                             f"{default_kind!r}")
        self.default_kind = default_kind
        self._create_backend = create_backend
        self._auto_complete_here = auto_complete_here
        self.service: Any = None  # set once the service exists (it is built after us)
        self.link: Any = None

    def kind_for(self, config: Any) -> str:
        return kind_for(config, self.default_kind)

    def build(self, info: InstanceInfo, config: Any, loop: asyncio.AbstractEventLoop,
              on_done: DoneCallback) -> Instance:
        module = importlib.import_module(KINDS[self.kind_for(config)])
        spec = InstanceSpec(info, config, loop, on_done, self._create_backend, self.link,
                            self.service)
        instance: Instance = module.build(spec)
        return instance

    def auto_complete(self, model_dir: Path, config: Any) -> Any:
        """The model's ``auto_complete_config``, run where its instances will run: a model
        of the process kind has it run in a process of its own (the server never imports
        that model's file)."""
        if self.kind_for(config) == "process":
            from tritium.execution.process import autocomplete

            return autocomplete.complete_in_process(model_dir, config)
        if self._auto_complete_here is None:
            return config
        return self._auto_complete_here(model_dir, config)


def kind_for(config: Any, default_kind: str) -> str:
    """The model's own choice if its config makes one, else ``default_kind``; a model that
    names an EXECUTION_ENV_PATH gets a process (only a process can run that Python)."""
    parameter = config.parameters.get(KIND_PARAMETER) if config.parameters else None
    if parameter is None:
        return "process" if _names_environment(config) else default_kind
    value = parameter.string_value.strip().lower()
    if value not in KINDS:
        raise TritiumError(
            ErrorCode.INVALID_ARG,
            f"model '{config.name}': parameter {KIND_PARAMETER} must be one of "
            f"{', '.join(KINDS)}, not '{parameter.string_value}'")
    if value == "thread" and _names_environment(config):
        log.warning("model '%s': %s is ignored, as %s is 'thread': its instances run in the "
                    "server's own Python", config.name, ENV_PARAMETER, KIND_PARAMETER)
    return value


def _names_environment(config: Any) -> bool:
    parameter = config.parameters.get(ENV_PARAMETER) if config.parameters else None
    return parameter is not None and bool(parameter.string_value)
