"""Builds the process kind's instance slot for a model: a ``SupervisedInstance`` whose
processes run the model's ``EXECUTION_ENV_PATH`` interpreter when it names one."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from tritium.execution.backend import InstanceInfo
from tritium.execution.kinds import InstanceSpec
from tritium.execution.placement import current
from tritium.execution.process import death, environment
from tritium.execution.process.environment import ExecutionEnvironment
from tritium.execution.process.instance import LAUNCH_MODULE, ProcessInstance
from tritium.execution.process.supervisor import (
    ProcessDone,
    SlotDone,
    SupervisedInstance,
    kill_after_cancel_secs,
)

# (model directory, configured path, its size and mtime) -> the resolution, shared by a
# model's instances; a changed archive is resolved (extracted) afresh at the next load.
_environments: dict[tuple[str, str, int, int],
                    asyncio.Future[ExecutionEnvironment | None]] = {}


async def environment_for(config: Any, model_dir: str) -> ExecutionEnvironment | None:
    """The model's environment, resolved once per path (off the loop: it may extract an
    archive and runs the interpreter once); a failure is retried at the next load."""
    configured = environment.configured_path(config, model_dir)
    if configured is None:
        return None
    try:
        stat = os.stat(configured)
        key = (model_dir, configured, stat.st_size, stat.st_mtime_ns)
    except OSError:
        key = (model_dir, configured, -1, -1)  # resolve() says what is wrong with it
    future = _environments.get(key)
    if future is None or (future.done() and future.exception() is not None):
        future = _environments[key] = asyncio.ensure_future(
            asyncio.to_thread(environment.resolve, config, model_dir))
    return await asyncio.shield(future)


def supervised_instance(info: InstanceInfo, config: Any, loop: asyncio.AbstractEventLoop,
                        on_done: SlotDone, service: Any) -> SupervisedInstance:
    """One instance slot of the process kind (checks its config parameters now)."""
    chosen: list[ExecutionEnvironment] = []

    async def prepare() -> None:
        env = await environment_for(config, str(Path(info.model_repository)))
        if env is not None:
            chosen.append(env)

    def make_process(done: ProcessDone) -> ProcessInstance:
        process = ProcessInstance(info, config, loop, done, service)
        env = chosen[0] if chosen else None
        if env is not None:
            process.spawn_command = lambda _info: env.command(LAUNCH_MODULE, [])
        process.spawn_env = lambda base: _spawn_env(base, env)
        return process

    return SupervisedInstance(info, make_process, loop, on_done,
                              kill_after_cancel_s=kill_after_cancel_secs(config),
                              prepare=prepare)


def _spawn_env(base: dict[str, str], env: ExecutionEnvironment | None) -> dict[str, str]:
    spawned = env.spawn_env(base) if env is not None else dict(base)
    cores = current().everywhere
    if cores:
        spawned[death.CORES_ENV] = ",".join(map(str, sorted(cores)))
    return spawned


def build(spec: InstanceSpec) -> SupervisedInstance:
    """The process kind: model code runs in a process of its own, restarted when it dies;
    its calls to the server are served here with the server's service."""
    return supervised_instance(spec.info, spec.config, spec.loop, spec.on_done, spec.service)
