"""EnsembleModel: the ``ModelHandle`` of one loaded ``platform: "ensemble"`` version."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tritium.core.cancellation import CancelReason
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.inflight import InFlight
from tritium.core.request import AdmittedRequest, RequestStage
from tritium.core.response import InferenceResponse, ServedBy
from tritium.core.response_cache import ResponseCache, cache_for
from tritium.core.statistics import ModelStatistics
from tritium.core.types import TensorSpec
from tritium.ensemble.graph import EnsembleGraph
from tritium.ensemble.limits import StepLimits
from tritium.ensemble.plan import EnsemblePlan
from tritium.ensemble.runtime import EnsembleRun, StepTimes
from tritium.repository.config import config_to_json, tensor_specs

if TYPE_CHECKING:
    from tritium.core.service import InferenceService

log = logging.getLogger("tritium.ensemble")


class EnsembleModel:
    """Implements ``tritium.core.model.ModelHandle`` for one version of an ensemble.

    ``EnsembleModel(plan, config, service, version=1)``: ``plan`` is
    ``EnsemblePlan.from_config(config)``, ``config`` the validated, completed
    ``ModelConfig`` and ``service`` the server's ``InferenceService``, through which every
    step is submitted as a child request (so each composing model's scheduler, dynamic
    batcher and statistics see it as they see a client's). Construct it on the server
    loop once the composing models are loaded: whether the ensemble is decoupled is read
    from them here (Triton's rule: decoupled when any step's model is).

    Its lifecycle mirrors ``LoadedModel``'s, so the manager can hold either in a version
    slot: ``await start()`` (nothing to start), ``in_flight()``, ``await drain(timeout_s)``,
    ``await stop()``, ``load_seconds``.
    """

    def __init__(self, plan: EnsemblePlan, config: Any, service: InferenceService,
                 version: int = 1, response_cache: ResponseCache | None = None):
        self.plan = plan
        self.service = service
        self._graph = EnsembleGraph(plan)
        self._limits = StepLimits(len(plan.steps),
                                  config.ensemble_scheduling.max_inflight_requests)
        if self._limits.limit > 0:
            log.info("Ensemble model '%s' configured with max_inflight_requests: %d",
                     config.name, self._limits.limit)
        self.name: str = config.name
        self.version = version
        self.platform: str = "ensemble"
        self.max_batch_size: int = config.max_batch_size
        inputs, outputs = tensor_specs(config)
        self.inputs: Mapping[str, TensorSpec] = inputs
        self.outputs: Mapping[str, TensorSpec] = outputs
        self._output_dims = {name: spec.reshape if spec.reshape is not None else spec.dims
                             for name, spec in outputs.items()}
        self.labels: dict[str, list[str]] = {}
        self.served_by = ServedBy(self.name, version, self.max_batch_size > 0, self.labels)
        self.decoupled: bool = (config.model_transaction_policy.decoupled
                                or self._any_step_decoupled())
        if self.decoupled and not config.model_transaction_policy.decoupled:
            # Triton fills the field in for an ensemble: clients read it to pick streaming.
            completed = type(config)()
            completed.CopyFrom(config)
            completed.model_transaction_policy.decoupled = True
            config = completed
        self.config = config
        self.config_json: dict[str, Any] = config_to_json(config)
        self.load_seconds = 0.0
        self.namespace = ""  # its repository, under --model-namespacing (a metrics label)
        self.accepting = True
        self._stats = ModelStatistics()
        if self.decoupled and config.response_cache.enable:
            raise TritiumError(
                ErrorCode.INVALID_ARG,
                f"Response Cache does not currently support model {self.name} with "
                "'decoupled' transaction policy. Please disable the response cache.")
        # Triton caches an ensemble's own responses (its steps cache by their own configs).
        self.cache = cache_for(config, response_cache, version, self._stats)
        self._runs: dict[AdmittedRequest, EnsembleRun] = {}
        # Ensemble requests whose final response is not sent: what an unload waits for.
        self._admitted: InFlight[AdmittedRequest] = InFlight()

    def _any_step_decoupled(self) -> bool:
        for step in self.plan.steps:
            version = None if step.model_version < 0 else step.model_version
            try:
                if self.service.member_model(step.model_key, version).decoupled:
                    return True
            except TritiumError:
                continue  # validation at load refuses a missing model; a request will too
        return False

    # -- ModelHandle -------------------------------------------------------------
    def is_ready(self) -> bool:
        """Ready while accepting and every composing model is (one whose instance process is
        restarting is not): a request now would wait or fail in that step."""
        if not self.accepting:
            return False
        member_ready = self.service.member_ready
        return all(member_ready(step.model_key,
                               None if step.model_version < 0 else step.model_version)
                   for step in self.plan.steps)

    def enqueue(self, request: AdmittedRequest) -> None:
        if not self.accepting:
            raise TritiumError(
                ErrorCode.UNAVAILABLE,
                f"model '{self.name}' version {self.version} is not accepting new requests",
            )
        if self.cache is not None and self.cache.answer(request):
            self._admitted.add(request)
            return
        # As Triton's ensemble scheduler: the request executes once handed to its steps;
        # each step's own request is queued (or not) by its model.
        request.move_to(RequestStage.QUEUED)
        request.move_to(RequestStage.EXECUTING)
        self._stats.executing += 1
        run = EnsembleRun(self._graph, self.service, request, self.decoupled,
                          self.max_batch_size > 0, self._output_dims, self._limits)
        self._runs[request] = run
        self._admitted.add(request)
        self._stats.queue.add(time.monotonic_ns() - request.arrival_ns)
        self.service.loop.call_soon(run.start)

    def request_cancelled(self, request: AdmittedRequest) -> None:
        run = self._runs.get(request)
        if run is None or request.stream.closed:
            return
        reason = request.cancellation.reason
        self._stats.record_cancel(request.describe(), reason.name if reason else "UNKNOWN",
                                  "executing", request.cancellation.cancelled_at_ns)
        log.info("request %s for model '%s' version %d cancelled while executing: %s",
                 request.describe(), self.name, self.version,
                 reason.value if reason else "unknown",
                 extra={"request_id": request.describe(), "model": self.name,
                        "version": self.version, "cancel_stage": "executing",
                        "cancel_reason": reason.value if reason else "unknown"})
        run.cancel()
        # The service leaves a cancelled internal request (BLS) open while it executes;
        # an ensemble starts no further step, so it ends here, whoever asked.
        error = (reason or CancelReason.CLIENT_CANCELLED).to_error()
        request.stream.close_with(InferenceResponse.failure(error))

    def request_finished(self, request: AdmittedRequest, error: TritiumError | None) -> None:
        self._admitted.discard(request)
        if self.cache is not None and self.cache.finished(request):
            return
        run = self._runs.pop(request, None)
        if request.stage is not RequestStage.DONE:
            request.move_to(RequestStage.DONE)
        self._stats.executing -= 1
        if run is not None:
            run.finished()
        self._count_outcome(request, error, run.times if run is not None else StepTimes())

    def statistics(self) -> ModelStatistics:
        return self._stats

    def _count_outcome(self, request: AdmittedRequest, error: TritiumError | None,
                       times: StepTimes) -> None:
        """Triton's figures for an ensemble: its own request's success or failure, with the
        compute times of its steps summed into its compute durations."""
        stats = self._stats
        elapsed = time.monotonic_ns() - request.arrival_ns
        if request.cancellation.is_cancelled():
            stats.failures["CANCELED"] += 1
            stats.fail.add(elapsed)
            return
        if error is not None:
            # Triton reports a failed ensemble with FailureReason::OTHER.
            stats.failures["OTHER"] += 1
            stats.fail.add(elapsed)
            return
        stats.success.add(elapsed)
        stats.inference_count += request.batch_size
        stats.record_execution(request.batch_size, 1, times.compute_ns)
        stats.last_inference_ms = time.time_ns() // 1_000_000

    # -- lifecycle (as LoadedModel's) --------------------------------------------
    async def start(self, *_: object) -> None:
        """Nothing runs on its own: each request runs on its composing models."""

    async def stop(self) -> None:
        self.accepting = False
        if self.cache is not None:
            self.cache.close()

    def in_flight(self) -> int:
        return len(self._admitted)

    def unavailable_reason(self) -> str | None:
        return None  # its composing models say for themselves

    def instances_up(self) -> bool:
        return True  # it has no instances of its own

    async def drain(self, timeout_s: float) -> int:
        """Stop admitting, give admitted requests ``timeout_s`` to finish, then cancel the
        rest with reason UNLOADED. Returns how many were cancelled."""
        self.accepting = False
        leftover = await self._admitted.left_after(timeout_s)
        for request in leftover:
            log.warning("ensemble request %s for '%s' did not finish within %.1f s of the "
                        "unload; cancelling it", request.describe(), self.name, timeout_s)
            request.cancellation.cancel(CancelReason.UNLOADED)
        return len(leftover)
