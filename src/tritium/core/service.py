"""InferenceService: the one API every frontend (and BLS) calls."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tritium.core import messages
from tritium.core.cancellation import Cancellation, CancelReason
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.inflight import InFlight
from tritium.core.logging_settings import LogSettings, LogValue, TraceValue
from tritium.core.model import (
    IndexEntry,
    ModelHandle,
    ModelMetadata,
    ModelRepository,
    TensorMetadata,
)
from tritium.core.names import check_model_name
from tritium.core.request import AdmittedRequest, InferenceRequest, RequestStage
from tritium.core.response import InferenceResponse, ResponseStream
from tritium.core.statistics import ModelStatistics
from tritium.core.tracing import QUEUE_START, TENSOR_QUEUE_INPUT, NoTracer, Tracer
from tritium.core.validation import validate_request


@dataclass(frozen=True, slots=True)
class ModelStatisticsEntry:
    name: str
    version: int
    stats: ModelStatistics


SERVER_NAME = "triton"
SERVER_VERSION = "2.73.0"
EXTENSIONS = (
    "classification",
    "model_repository",
    "model_configuration",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
)


@dataclass(frozen=True, slots=True)
class DrainReport:
    """How a shutdown drain ended: requests that finished, and those it cancelled."""

    drained: int
    cancelled: int


class InferenceService:
    def __init__(
        self,
        repository: ModelRepository,
        loop: asyncio.AbstractEventLoop,
        extensions: tuple[str, ...] = EXTENSIONS,
        server_id: str = SERVER_NAME,
        strict_readiness: bool = True,
        tracer: Tracer | None = None,
    ):
        self.repository = repository
        self.server_id = server_id  # --id: the name server metadata answers
        # --strict-readiness: ready only while every model meant to serve is ready.
        self.strict_readiness = strict_readiness
        self.loop = loop
        self.extensions = extensions
        self.accepting = True  # False once shutdown begins
        # Still admitting, but telling load balancers to send no more (a lame duck).
        self.leaving = False
        # Admitted requests whose final response is not sent yet, whatever their model.
        # Each is also in its model version's own set (``ModelHandle.enqueue``): a shutdown
        # waits for the server's, an unload for one version's, while others keep running.
        self._in_flight: InFlight[AdmittedRequest] = InFlight()
        self._log_settings = LogSettings()
        # Frontends read ``tracer.enabled`` before starting a trace for a request.
        self.tracer: Tracer = tracer if tracer is not None else NoTracer()

    # -- health and metadata ---------------------------------------------------
    def is_live(self) -> bool:
        return True

    def is_ready(self) -> bool:
        if not self.accepting or self.leaving:
            return False
        return not self.strict_readiness or self.repository.is_ready()

    def server_metadata(self) -> dict[str, Any]:
        return {"name": self.server_id, "version": SERVER_VERSION,
                "extensions": list(self.extensions)}

    def model(self, name: str, version: int | None = None) -> ModelHandle:
        return self.repository.resolve(name, version)

    def member_model(self, key: str, version: int | None = None) -> ModelHandle:
        """An ensemble step's model, by its plan's key (qualified by its repository where
        several repositories have that name)."""
        return self.repository.resolve_member(key, version)

    def member_ready(self, key: str, version: int | None = None) -> bool:
        try:
            return self.repository.resolve_member(key, version).is_ready()
        except TritiumError:
            return False

    def model_ready(self, name: str, version: int | None = None) -> bool:
        try:
            return self.repository.resolve(name, version).is_ready()
        except TritiumError:
            return False

    def model_metadata(self, name: str, version: int | None = None) -> ModelMetadata:
        model = self.repository.resolve(name, version)
        versions = [model.version] if version is not None else self.repository.ready_versions(name)
        prefix = [-1] if model.max_batch_size > 0 else []
        return ModelMetadata(
            name=model.name,
            versions=[str(v) for v in versions],
            platform=model.platform,
            inputs=[
                TensorMetadata(s.name, s.datatype.wire, prefix + list(s.dims))
                for s in model.inputs.values()
            ],
            outputs=[
                TensorMetadata(s.name, s.datatype.wire, prefix + list(s.dims))
                for s in model.outputs.values()
            ],
        )

    def model_statistics(self, name: str | None = None, version: int | None = None
                         ) -> list[ModelStatisticsEntry]:
        """Statistics of one version, of every ready version of a model, or of every
        ready version of every model (``name`` None)."""
        if name is None:
            names = sorted({entry.name for entry in self.repository.index(ready_only=True)})
        else:
            names = [name]
        entries = []
        for model_name in names:
            versions = [version] if version is not None else self.repository.ready_versions(
                model_name)
            if name is not None and not versions:
                check_model_name(model_name)
                raise TritiumError(
                    ErrorCode.INVALID_ARG, f"requested model '{model_name}' is not available"
                )
            for number in versions:
                model = self.repository.resolve(model_name, number)
                entries.append(ModelStatisticsEntry(model.name, model.version,
                                                    model.statistics()))
        return entries

    def repository_index(self, ready_only: bool = False) -> list[IndexEntry]:
        return self.repository.index(ready_only)

    async def load_model(self, name: str, parameters: Mapping[str, Any]) -> None:
        await self.repository.load(name, parameters)

    async def unload_model(self, name: str, parameters: Mapping[str, Any]) -> None:
        await self.repository.unload(name, parameters)

    # -- logging and trace settings ----------------------------------------------
    def log_settings(self) -> dict[str, LogValue]:
        return self._log_settings.current()

    def note_log_file(self, path: str) -> None:
        """The file the log goes to (set at startup), as the log settings report it."""
        self._log_settings.file = path

    def update_log_settings(self, changes: Mapping[str, Any]) -> dict[str, LogValue]:
        """Validate and apply ``changes`` to the server's logging; returns the settings."""
        return self._log_settings.update(changes)

    def trace_settings(self, model_name: str | None = None) -> dict[str, TraceValue]:
        self._check_trace_model(model_name)
        return self.tracer.settings(model_name or None)

    def update_trace_settings(self, changes: Mapping[str, Any], model_name: str | None = None
                              ) -> dict[str, TraceValue]:
        self._check_trace_model(model_name)
        return self.tracer.update(changes, model_name or None)

    def _check_trace_model(self, model_name: str | None) -> None:
        if model_name and not self.model_ready(model_name):
            raise TritiumError(ErrorCode.INVALID_ARG, f"Request for unknown model : {model_name}")

    # -- inference -------------------------------------------------------------
    def submit(self, request: InferenceRequest, cancellation: Cancellation,
               allow_decoupled: bool = True, internal: bool = False,
               model: ModelHandle | None = None) -> ResponseStream:
        """Validate and admit ``request``, cancelled through the caller's ``cancellation``
        (made for this service's loop); its responses arrive on the returned stream.
        ``internal``: made by a model (BLS), not a client, so admitted while draining.
        ``model``: the handle the caller resolved for this request in the same step of the
        loop (no await since), so nothing can have swapped it; without it, it is resolved.

        The cancellation is this request's: once the request finished or was refused, it
        stops following its parents (``Cancellation.detach``), so a long-lived parent
        such as a gRPC stream keeps no callback per finished request.

        Raises TritiumError when the request is not admitted (nothing is queued then).
        """
        if cancellation.loop is not self.loop:
            # Its callbacks would run on another loop's thread, racing the scheduler.
            raise TritiumError(
                ErrorCode.INTERNAL, "a request's cancellation must be made for the server's loop"
            )
        try:
            return self._admit(request, cancellation, allow_decoupled, internal, model)
        except BaseException:
            cancellation.detach()
            raise

    def _admit(self, request: InferenceRequest, cancellation: Cancellation,
               allow_decoupled: bool, internal: bool, model: ModelHandle | None
               ) -> ResponseStream:
        # A BLS child of a request that is still draining must be able to finish it.
        if not self.accepting and not internal:
            raise TritiumError(
                ErrorCode.UNAVAILABLE, "Server is shutting down and not accepting new requests"
            )
        if model is None or model.name != request.model_name or (
                request.model_version is not None and request.model_version != model.version):
            model = self.repository.resolve(request.model_name, request.model_version)
        if model.decoupled and not allow_decoupled:
            raise TritiumError(
                ErrorCode.UNSUPPORTED,
                f"model '{model.name}' uses the decoupled transaction policy, which this "
                "endpoint does not support; use a streaming endpoint",
            )
        batch_size = validate_request(request, model)
        if cancellation.reason is not None:
            raise cancellation.reason.to_error()
        # A model's own request (BLS) cancelled by that model is only asked to stop, as
        # Triton's TRITONSERVER_InferenceRequestCancel does: once executing, whatever the
        # child still sends reaches the caller, who is still reading.
        stream = ResponseStream(self.loop, None if internal else cancellation,
                                model.served_by)
        admitted = AdmittedRequest(request, cancellation, stream, batch_size)
        if request.trace is None:
            trace = None
            model.enqueue(admitted)
        else:
            trace = _traced_enqueue(model, admitted)

        def on_cancel(cancelled: Cancellation) -> None:
            assert cancelled.reason is not None
            if trace is not None:
                trace.cancelled(cancelled.reason.value, admitted.stage.value,
                                cancelled.cancelled_at_ns or time.monotonic_ns())
            # The scheduler reads the request's stage before the stream is closed.
            model.request_cancelled(admitted)
            if (internal and cancelled.reason is CancelReason.CLIENT_CANCELLED
                    and admitted.stage is RequestStage.EXECUTING):
                return
            stream.close_with(InferenceResponse.failure(cancelled.reason.to_error()))

        def on_done() -> None:
            if trace is not None:
                error = stream.error
                trace.end(None if error is None else error.message, time.monotonic_ns())
            self._in_flight.discard(admitted)
            model.request_finished(admitted, stream.error)
            cancellation.remove_callback(on_cancel)
            cancellation.detach()

        self._in_flight.add(admitted)
        stream.on_done = on_done
        cancellation.add_callback(on_cancel)
        return stream

    def in_flight(self) -> list[AdmittedRequest]:
        """Admitted requests whose final response has not been sent yet."""
        return list(self._in_flight)

    async def wait_idle(self) -> None:
        """Return once no admitted request is unfinished."""
        await self._in_flight.wait_empty()

    # -- lifecycle -------------------------------------------------------------
    def start_leaving(self) -> None:
        """Shutdown is coming: readiness fails from now on, requests are still admitted
        (until ``stop_accepting``) so that none is refused before load balancers notice."""
        self.leaving = True

    def stop_accepting(self) -> None:
        """Shutdown began: readiness fails and ``submit`` refuses from now on."""
        self.accepting = False

    async def drain(self, timeout_s: float) -> DrainReport:
        """Stop accepting, wait up to ``timeout_s`` for admitted requests to finish,
        then cancel the rest with reason SHUTDOWN (their clients get that error)."""
        self.stop_accepting()
        waiting = len(self._in_flight)
        try:
            async with asyncio.timeout(timeout_s):
                await self.wait_idle()
        except TimeoutError:
            pass
        cancelled = self.cancel_all(CancelReason.SHUTDOWN)
        return DrainReport(drained=max(waiting - cancelled, 0), cancelled=cancelled)

    def cancel_all(self, reason: CancelReason) -> int:
        """Cancel every unfinished request; returns how many there were."""
        requests = list(self._in_flight)  # a snapshot: cancelling may finish them
        for request in requests:
            request.cancellation.cancel(reason)
        return len(requests)

    async def infer(self, request: InferenceRequest, cancellation: Cancellation,
                    model: ModelHandle | None = None) -> InferenceResponse:
        """One request, one response, for models that are not decoupled (``model``: as
        for ``submit``)."""
        stream = self.submit(request, cancellation, allow_decoupled=False, model=model)
        response = await stream.receive()
        return response if _lone(response) else await _single_response(
            stream, response, messages.INFER_ONE_RESPONSE)

    async def generate(self, request: InferenceRequest, cancellation: Cancellation
                       ) -> InferenceResponse:
        """One request, exactly one response, decoupled models allowed."""
        stream = self.submit(request, cancellation, allow_decoupled=True)
        response = await stream.receive()
        return response if _lone(response) else await _single_response(
            stream, response, messages.GENERATE_ONE_RESPONSE)


def _traced_enqueue(model: ModelHandle, admitted: AdmittedRequest) -> Any:
    """Enqueue a traced request: it gets a trace of its own, a child of what it was traced
    under (its REQUEST_START when it arrived), which it returns."""
    request = admitted.request
    trace = request.trace = request.trace.spawn(model.name, model.version, request.id,
                                                admitted.arrival_ns)
    trace.event(QUEUE_START, time.monotonic_ns())
    trace.tensors(TENSOR_QUEUE_INPUT, request.inputs.values())
    try:
        model.enqueue(admitted)
    except TritiumError as refused:
        trace.end(refused.message, time.monotonic_ns())  # nothing else will end its span
        raise
    stream = admitted.stream
    late = stream.on_late_final
    if late is not None:  # decoupled: a FINAL after a cancel is when the model stopped
        trace.expect_stop()

        def stopped() -> None:
            trace.stopped(time.monotonic_ns())
            late()

        stream.on_late_final = stopped
    return trace


def _lone(response: InferenceResponse) -> bool:
    """Whether a stream's first response is its whole answer: final, not an error, not a
    bare flag. The usual case, settled without awaiting ``_single_response``."""
    return response.final and response.error is None and not response.flag_only


async def _single_response(stream: ResponseStream, response: InferenceResponse,
                           refusal: str) -> InferenceResponse:
    """The one response of a stream whose first was ``response``; INTERNAL with
    ``refusal`` (formatted with the count) when the model sent none or several, as
    Triton's HTTP frontend words it."""
    result: InferenceResponse | None = None
    count = 0
    while True:
        if response.error is not None:
            raise response.error
        if not response.flag_only:
            count += 1
            result = response
        if response.final:
            break
        response = await stream.receive()
    if count != 1 or result is None:
        raise TritiumError(ErrorCode.INTERNAL, refusal.format(count=count))
    return result
