"""Which kind of instance a model gets: a thread of the server, or a process of its own.

The server flag ``--python-instance-kind`` sets the default (``configure``); a model's
config parameter ``TRITIUM_INSTANCE_KIND`` (``process`` or ``thread``) wins over it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from tritium.core.errors import ErrorCode, TritiumError
from tritium.execution.backend import InstanceInfo, ModelBackend
from tritium.execution.instance import DoneCallback, ModelInstance
from tritium.execution.process import shm
from tritium.execution.process.environment import PARAMETER as ENV_PARAMETER
from tritium.execution.process.launch import supervised_instance
from tritium.execution.process.supervisor import SupervisedInstance
from tritium.feature_config import ProcessArenaSettings

KIND_PARAMETER = "TRITIUM_INSTANCE_KIND"
log = logging.getLogger("tritium.execution")
KINDS = ("thread", "process")

_default_kind = "thread"
_service: Any = None  # the server's InferenceService, for calls from instance processes


def configure(default_kind: str, service: Any,
              arena: ProcessArenaSettings | None = None) -> None:
    """Set by the server once at startup (one server per process, as scope.py assumes)."""
    global _default_kind, _service
    if arena is not None:
        shm.configure(arena.ring_bytes, arena.name_prefix)
    if default_kind not in KINDS:
        raise ValueError(f"instance kind must be one of {', '.join(KINDS)}: {default_kind!r}")
    _default_kind = default_kind
    _service = service


def kind_for(config: Any) -> str:
    """The model's own choice if its config makes one, else the server's default; a model
    that names an EXECUTION_ENV_PATH gets a process (only a process can run that Python)."""
    parameter = config.parameters.get(KIND_PARAMETER) if config.parameters else None
    if parameter is None:
        return "process" if _names_environment(config) else _default_kind
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


def make_instance(info: InstanceInfo, config: Any, loop: asyncio.AbstractEventLoop,
                  on_done: Callable[..., None],
                  create_backend: Callable[[InstanceInfo], ModelBackend]
                  ) -> ModelInstance | SupervisedInstance:
    if kind_for(config) == "process":
        # Supervised (SUPERVISION): restarted when it dies, EXECUTION_ENV_PATH, kill option.
        return supervised_instance(info, config, loop, on_done, _service)
    done: DoneCallback = on_done
    return ModelInstance(info, create_backend, loop, done)
