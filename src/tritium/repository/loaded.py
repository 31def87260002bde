"""A loaded model version: its config, its scheduler and its running instances."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

from tritium.core.cancellation import CancelReason
from tritium.core.config_pb import model_config_pb2
from tritium.core.errors import TritiumError
from tritium.core.first_response import FirstResponseHistogram
from tritium.core.inflight import InFlight
from tritium.core.request import AdmittedRequest
from tritium.core.response import ServedBy
from tritium.core.response_cache import ResponseCache, cache_for
from tritium.core.statistics import ModelStatistics
from tritium.core.types import TensorSpec
from tritium.execution.backend import InstanceInfo
from tritium.execution.kinds import Instance, InstanceBuilder
from tritium.repository.config import config_to_json, tensor_specs
from tritium.repository.validation import ConfigError
from tritium.repository.warmup import WarmupRoute, warm_up, warmup_samples
from tritium.scheduling.rate_limiter import Gate, RateLimiter
from tritium.scheduling.scheduler import ModelScheduler, SchedulerPolicy
from tritium.scheduling.sequence_direct import DirectSequenceScheduler
from tritium.scheduling.sequence_oldest import OldestSequenceScheduler

log = logging.getLogger("tritium.repository")

ModelConfig = model_config_pb2.ModelConfig

_KIND_NAMES = {
    model_config_pb2.ModelInstanceGroup.KIND_CPU: "CPU",
    model_config_pb2.ModelInstanceGroup.KIND_GPU: "GPU",
    model_config_pb2.ModelInstanceGroup.KIND_MODEL: "MODEL",
    model_config_pb2.ModelInstanceGroup.KIND_AUTO: "CPU",
}


class LoadedModel:
    """Implements ``tritium.core.model.ModelHandle`` for one model version."""

    def __init__(self, model_dir: Path, version: int, config: Any,
                 response_cache: ResponseCache | None = None,
                 rate_limiter: RateLimiter | None = None):
        self.model_dir = model_dir
        self.name: str = config.name
        self.version = version
        self.config = config
        self.config_json: dict[str, Any] = config_to_json(config)
        self.platform: str = config.platform or config.backend or "python"
        self.decoupled: bool = config.model_transaction_policy.decoupled
        self.max_batch_size: int = config.max_batch_size
        inputs, outputs = tensor_specs(config)
        self.inputs: Mapping[str, TensorSpec] = inputs
        self.outputs: Mapping[str, TensorSpec] = outputs
        self.labels: dict[str, list[str]] = _read_labels(model_dir, config)
        self.served_by = ServedBy(self.name, version, self.max_batch_size > 0, self.labels)
        self.scheduler = _scheduler(self.name, version, config, self.decoupled, model_dir)
        self.instances: list[Instance] = []
        self._rate_limiter = rate_limiter  # --rate-limit execution_count; None: off
        self._gates: list[Gate] = []  # the instances as the scheduler sees them, when limited
        self.cache = cache_for(config, response_cache, version, self.scheduler.stats)
        self.load_seconds = 0.0
        self.namespace = ""  # its repository, under --model-namespacing (a metrics label)
        # --metrics-config histogram_latencies=true: arrival to first response
        self.first_response: FirstResponseHistogram | None = None
        # Admitted requests whose final response has not been sent: what an unload waits
        # for. (The service's own set holds them too: a shutdown asks about every model.)
        self._admitted: InFlight[AdmittedRequest] = InFlight()

    # -- ModelHandle -------------------------------------------------------------
    def is_ready(self) -> bool:
        # An instance process that died is restarting: ready again once one is up.
        return self.scheduler.accepting and (
            not self.instances or any(i.ready for i in self.instances))

    def enqueue(self, request: AdmittedRequest) -> None:
        cache = self.cache
        # A version that stopped admitting (unloading) answers nothing, not even a hit.
        if cache is not None and self.scheduler.accepting and cache.answer(request):
            self._admitted.add(request)
            return
        histogram = self.first_response
        if histogram is not None:
            request.stream.on_first = partial(histogram.observe_since, request.arrival_ns)
        try:
            self.scheduler.enqueue(request)
        except TritiumError:
            if cache is not None:
                cache.forget(request)
            raise
        self._admitted.add(request)
        if self.decoupled:
            request.stream.on_late_final = lambda: self.scheduler.model_stopped(request)

    def request_cancelled(self, request: AdmittedRequest) -> None:
        self.scheduler.request_cancelled(request)

    def request_finished(self, request: AdmittedRequest, error: TritiumError | None) -> None:
        cache = self.cache
        if cache is None or not cache.finished(request):
            self.scheduler.request_finished(request, error)
        self._admitted.discard(request)

    def statistics(self) -> ModelStatistics:
        return self.scheduler.stats

    def unavailable_reason(self) -> str | None:
        """Why this loaded version cannot serve: every instance gave up restarting."""
        failures = [i.failure for i in self.instances]
        if not failures or any(f is None for f in failures):
            return None
        return failures[0].message if failures[0] is not None else None

    def instances_up(self) -> bool:
        """Every instance runs (none is restarting or has given up)."""
        return all(i.ready for i in self.instances)

    def instance_restarts(self) -> dict[str, int]:
        """Restarts of each instance, by instance name (metrics read it)."""
        return {i.name: i.restarts for i in self.instances}

    # -- lifecycle ---------------------------------------------------------------
    async def start(self, loop: asyncio.AbstractEventLoop, builder: InstanceBuilder) -> None:
        """Start every instance, of the kind ``builder`` chooses for this model."""
        started = time.monotonic()
        config_text = json.dumps(self.config_json)
        samples = await asyncio.to_thread(warmup_samples, self.config, self.model_dir)
        # Only a model with warmup samples reports through the route's extra hop.
        route = WarmupRoute() if samples else None
        on_done = route if route is not None else self.scheduler.batch_done
        try:
            placed = self._instance_infos(config_text)
            self._gates = self._register_gates(placed)  # may refuse before anything starts
            for index, (info, _) in enumerate(placed):
                gate = self._gates[index] if self._gates else None
                done = on_done if gate is None else gate.finished
                self.instances.append(builder.build(info, self.config, loop, done))
                if gate is not None:
                    gate.instance, gate.target = self.instances[-1], on_done
            await asyncio.gather(*(instance.start() for instance in self.instances))
            if route is not None:
                await warm_up(self.name, samples, self.instances, route)
                route.target = self.scheduler.batch_done
        except BaseException:
            await self.stop()
            raise
        self.scheduler.add_instances(self._gates or self.instances)
        self.load_seconds = time.monotonic() - started

    async def stop(self) -> None:
        """Stop admitting, stop every instance and wait for ``finalize``."""
        self.scheduler.stop_accepting()
        if self._rate_limiter is not None:
            for gate in self._gates:
                self._rate_limiter.remove(gate)  # before the instances stop: see remove
        for instance in self.instances:
            instance.stop()
        await asyncio.gather(*(instance.wait_stopped() for instance in self.instances))
        if self.cache is not None:
            self.cache.close()

    def in_flight(self) -> int:
        """Admitted requests that have not sent their final response."""
        return len(self._admitted)

    async def drain(self, timeout_s: float) -> int:
        """Stop admitting, give admitted requests ``timeout_s`` to finish, then cancel the
        rest with reason UNLOADED (their clients get that error). Returns how many."""
        self.scheduler.stop_accepting()
        leftover = await self._admitted.left_after(timeout_s)
        for request in leftover:
            # Logged here because a decoupled model that never sends FINAL would
            # otherwise hold its client forever without a trace.
            log.warning(
                "request %s for model '%s' version %d did not finish within %.1f s of the "
                "unload; cancelling it", request.describe(), self.name, self.version, timeout_s,
            )
            request.cancellation.cancel(CancelReason.UNLOADED)
        return len(leftover)

    def _register_gates(self, placed: list[tuple[InstanceInfo, Any]]) -> list[Gate]:
        """Each instance's gate under the rate limiter (none when it is off); registering
        them checks the resources their groups need."""
        limiter = self._rate_limiter
        if limiter is None:
            return []
        gates: list[Gate] = []
        try:
            for info, group in placed:
                gates.append(limiter.gate(info.instance_name, info.device_id,
                                          group.rate_limiter))
        except BaseException:
            for gate in gates:
                limiter.remove(gate)
            raise
        return gates

    def _instance_infos(self, config_text: str) -> list[tuple[InstanceInfo, Any]]:
        """One entry per instance with its group, as Triton names and places them:
        ``<group name>_<i>``; KIND_GPU runs ``count`` instances on each listed GPU, other
        kinds use device 0."""
        infos = []
        gpu_kind = model_config_pb2.ModelInstanceGroup.KIND_GPU
        for group in self.config.instance_group:
            kind = _KIND_NAMES.get(group.kind, "CPU")
            devices = list(group.gpus) if group.kind == gpu_kind and group.gpus else [0]
            placements = [device for device in devices for _ in range(max(group.count, 1))]
            for index, device in enumerate(placements):
                infos.append((InstanceInfo(
                    model_name=self.name,
                    model_version=self.version,
                    model_repository=str(self.model_dir),
                    config_json=config_text,
                    instance_name=f"{group.name}_{index}",
                    kind=kind,
                    device_id=device,
                ), group))
        return infos


def _read_labels(model_dir: Path, config: Any) -> dict[str, list[str]]:
    """Each output's class labels, one per line of its ``label_filename`` (read once, here:
    label files are small, and a model whose file is missing must not load)."""
    labels: dict[str, list[str]] = {}
    for output in config.output:
        if not output.label_filename:
            continue
        path = model_dir / output.label_filename
        where = f"label file '{output.label_filename}' of output '{output.name}' for {config.name}"
        try:
            text = path.read_bytes().decode("utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read {where}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{where} is not valid UTF-8") from None
        lines = text.split("\n")
        if lines[-1] == "":
            lines.pop()  # the newline that ends the last label
        labels[output.name] = [line.removesuffix("\r") for line in lines]
    return labels


def _scheduler(name: str, version: int, config: Any, decoupled: bool, model_dir: Path
               ) -> ModelScheduler:
    """The default scheduler (with or without dynamic batching), or for a stateful model
    (``sequence_batching``) the sequence scheduler."""
    policy = SchedulerPolicy.from_config(config, model_dir)
    if policy.sequence is not None:
        if policy.sequence.oldest is not None:
            return OldestSequenceScheduler(name, version, policy, decoupled)
        return DirectSequenceScheduler(name, version, policy, decoupled)
    return ModelScheduler(name, version, policy, decoupled)
