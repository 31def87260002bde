"""gRPC methods: each decodes, calls ``core.InferenceService``, and encodes."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from grpc_health.v1 import health_pb2
from tritonclient.grpc import service_pb2 as pb

from tritium.core import offload, tracing
from tritium.core.cancellation import CancelReason
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.header_forward import HeaderForward
from tritium.core.inflight import InFlight
from tritium.core.model import ModelHandle
from tritium.core.request import InferenceRequest
from tritium.core.response import InferenceResponse, ResponseStream
from tritium.core.service import InferenceService
from tritium.core.shared_memory import SharedMemoryRegistry
from tritium.frontends.grpc import codec
from tritium.frontends.grpc import shared_memory as shm
from tritium.frontends.grpc.call import Call, Router, Rpc
from tritium.frontends.grpc.serving import fail_call

log = logging.getLogger("tritium.grpc")

SERVICE_NAME = "inference.GRPCInferenceService"
# A stream opened with this header set to "true" ends with the first failed response's
# status, as Triton's stream handler does; otherwise errors travel in-band.
ERROR_MODE_HEADER = "triton_grpc_error"
# Fields of the gRPC protocol itself, which gRPC servers keep out of a call's metadata.
_TRANSPORT_HEADERS = frozenset({"te", "content-type", "grpc-timeout", "grpc-encoding",
                                "grpc-accept-encoding"})


class InferenceServicer:
    """``inference.GRPCInferenceService`` over one ``InferenceService``."""

    def __init__(self, service: InferenceService, header_forward: HeaderForward | None = None,
                 shared_memory: SharedMemoryRegistry | None = None):
        self.service = service
        self.header_forward = header_forward
        # Regions clients registered, shared with HTTP; none may be without --allow-client-shm.
        self.shared_memory = shared_memory or SharedMemoryRegistry()

    # -- health and metadata ---------------------------------------------------
    async def ServerLive(self, request: Any, call: Call) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.service.is_live())

    async def ServerReady(self, request: Any, call: Call) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.service.is_ready())

    async def ModelReady(self, request: Any, call: Call) -> pb.ModelReadyResponse:
        # An unknown model is "not ready", not an error, as in Triton.
        version = codec.parse_version(request.version)
        return pb.ModelReadyResponse(ready=self.service.model_ready(request.name, version))

    async def ServerMetadata(self, request: Any, call: Call) -> pb.ServerMetadataResponse:
        return codec.encode_server_metadata(self.service.server_metadata())

    async def ModelMetadata(self, request: Any, call: Call) -> pb.ModelMetadataResponse:
        version = codec.parse_version(request.version)
        return codec.encode_model_metadata(self.service.model_metadata(request.name, version))

    async def ModelConfig(self, request: Any, call: Call) -> pb.ModelConfigResponse:
        model = self.service.model(request.name, codec.parse_version(request.version))
        return pb.ModelConfigResponse(config=model.config)

    async def ModelStatistics(self, request: Any, call: Call) -> Any:
        entries = self.service.model_statistics(
            request.name or None, codec.parse_version(request.version))
        return codec.encode_model_statistics(entries)

    # -- repository ------------------------------------------------------------
    async def RepositoryIndex(self, request: Any, call: Call) -> Any:
        return codec.encode_repository_index(self.service.repository_index(request.ready))

    async def RepositoryModelLoad(self, request: Any, call: Call) -> Any:
        parameters = codec.decode_repository_parameters(request.parameters)
        await self.service.load_model(request.model_name, parameters)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: Any, call: Call) -> Any:
        parameters = codec.decode_repository_parameters(request.parameters)
        await self.service.unload_model(request.model_name, parameters)
        return pb.RepositoryModelUnloadResponse()

    # -- settings --------------------------------------------------------------
    async def LogSettings(self, request: Any, call: Call) -> pb.LogSettingsResponse:
        changes = codec.decode_log_settings(request)  # none: a read
        settings = self.service.update_log_settings(changes) if changes else \
            self.service.log_settings()
        return codec.encode_log_settings(settings)

    async def TraceSetting(self, request: Any, call: Call) -> pb.TraceSettingResponse:
        changes = codec.decode_trace_settings(request)
        model = request.model_name or None
        settings = self.service.update_trace_settings(changes, model) if changes else \
            self.service.trace_settings(model)
        return codec.encode_trace_settings(settings)

    # -- shared memory: system regions (with --allow-client-shm); CUDA ones never --
    async def SystemSharedMemoryStatus(self, request: Any, call: Call) -> Any:
        return shm.system_status(self.shared_memory.status(request.name))

    async def SystemSharedMemoryRegister(self, request: Any, call: Call) -> Any:
        self.shared_memory.register(request.name, request.key, request.offset,
                                    request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(self, request: Any, call: Call) -> Any:
        if request.name:
            self.shared_memory.unregister(request.name)
        else:
            self.shared_memory.unregister_all()
        return pb.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(self, request: Any, call: Call) -> Any:
        self.shared_memory.cuda_status(request.name)  # lists none, or refuses the name
        return pb.CudaSharedMemoryStatusResponse()

    async def CudaSharedMemoryRegister(self, request: Any, call: Call) -> Any:
        self.shared_memory.register_cuda(request.name)

    async def CudaSharedMemoryUnregister(self, request: Any, call: Call) -> Any:
        self.shared_memory.unregister_cuda(request.name)
        return pb.CudaSharedMemoryUnregisterResponse()

    # -- inference -------------------------------------------------------------
    async def ModelInfer(self, message: Any, call: Call) -> list[bytes | memoryview]:
        # The call's cancellation: the transport cancels it however the call ends early.
        service = self.service
        model, request = _decode_on_loop(service, message, self.shared_memory)
        if request is None:  # too big to decode on the loop
            request = await offload.run(codec.decode_infer_request, message, model,
                                        self.shared_memory)
            resolved = None  # awaited: the repository may have changed since
        else:
            resolved = model  # no await since it was looked up: still the one
        if self.header_forward is not None:
            request.parameters.update(forwarded(self.header_forward, call))
        tracer = service.tracer
        if tracer.enabled:
            return await self._traced_infer(request, call, resolved)
        response = await service.infer(request, call.cancellation, resolved)
        if offload.heavy_response(response):
            return await offload.run(codec.encode_infer_response, response, request)
        return codec.encode_infer_response(response, request)

    async def _traced_infer(self, request: InferenceRequest, call: Call,
                            resolved: ModelHandle | None) -> list[bytes | memoryview]:
        request.trace = trace = tracing.begin(self.service.tracer, request.model_name,
                                              call.headers, tracing.GRPC_EVENTS)
        if trace is None:
            return await _encoded(await self.service.infer(request, call.cancellation,
                                                           resolved), request)
        sent = False
        try:
            response = await self.service.infer(request, call.cancellation, resolved)
            tracing.sending(trace, tracing.GRPC_EVENTS)
            encoded = await _encoded(response, request)
            sent = True
            return encoded
        finally:
            tracing.finish(trace, tracing.GRPC_EVENTS, sent)

    async def ModelStreamInfer(self, call: Call) -> None:
        await StreamSession(self.service, call, self.header_forward, self.shared_memory).run()


class StreamSession:
    """One ModelStreamInfer call: requests run concurrently, and each response is written
    the moment it is ready. The call ends once the client half-closed and every request
    has answered. At most ``max_stream_requests`` run at once; the next message is not
    read until one finishes, so a client that sends more stalls on its window.

    In error mode (``triton_grpc_error: true``) the first response that carries an error
    ends the call with that error's status instead: responses already written stay ahead
    of it, the other requests are cancelled, and nothing more is read or written. A request
    refused before it reached a model is still answered in-band, as in Triton."""

    def __init__(self, service: InferenceService, call: Call,
                 header_forward: HeaderForward | None = None,
                 shared_memory: SharedMemoryRegistry | None = None):
        self.service = service
        self.call = call
        self.header_forward = header_forward
        self.shared_memory = shared_memory
        self.in_flight: InFlight[asyncio.Task[None]] = InFlight()
        self._room: asyncio.Event = asyncio.Event()
        self._limit = call.conn.limits.max_stream_requests
        self._error_mode = call.headers.get(ERROR_MODE_HEADER) == "true"
        self._failed = False

    async def run(self) -> None:
        async for message in self.call.requests():
            if self._failed:  # messages that were already in when the call ended
                break
            await self._start(message)
            while len(self.in_flight) >= self._limit and not self._failed:
                self._room.clear()
                await self._room.wait()
        await self.in_flight.wait_empty()

    async def _start(self, message: Any) -> None:
        trace = None
        try:
            request = await decode_request(self.service, message, self.shared_memory)
            if self.header_forward is not None:  # the stream's headers, for each request
                request.parameters.update(forwarded(self.header_forward, self.call))
            tracer = self.service.tracer
            if tracer.enabled:
                request.trace = tracing.begin(tracer, request.model_name, self.call.headers,
                                              tracing.GRPC_EVENTS)
            trace = request.trace
            # Each request follows the call: its end cancels them all with its reason.
            stream = self.service.submit(request, self.call.cancellation.child())
        except TritiumError as exc:
            self.call.write(codec.encode_stream_error(exc, message.id))
            if trace is not None:
                tracing.finish(trace, tracing.GRPC_EVENTS, False)
            return
        task = asyncio.ensure_future(self._forward(request, stream))
        if trace is not None:
            task.add_done_callback(lambda _: tracing.finish(trace, tracing.GRPC_EVENTS, True))
        self.in_flight.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self.in_flight.discard(task)
        self._room.set()

    async def _forward(self, request: InferenceRequest, stream: ResponseStream) -> None:
        call = self.call
        async for response in stream:
            if self._failed:
                continue  # the call is over; the request was cancelled with it
            if response.error is not None and self._error_mode:
                self._fail(response)
                continue
            if offload.heavy_response(response):
                message = await offload.run(codec.encode_stream_response, response, request)
            else:
                message = codec.encode_stream_response(response, request)
            if message is not None:
                call.write(message)
                if call.blocked:
                    await call.drain()

    def _fail(self, response: InferenceResponse) -> None:
        """End the call with ``response``'s error, after what was already written."""
        assert response.error is not None
        self._failed = True
        fail_call(self.call.conn, self.call, response.error)
        # The stream that would carry their answers is gone, as if the client had left.
        self.call.cancellation.cancel(CancelReason.CLIENT_DISCONNECTED)
        self._room.set()


async def _encoded(response: InferenceResponse, request: InferenceRequest
                   ) -> list[bytes | memoryview]:
    if offload.heavy_response(response):
        return await offload.run(codec.encode_infer_response, response, request)
    return codec.encode_infer_response(response, request)


def forwarded(header_forward: HeaderForward, call: Call) -> dict[str, str]:
    """The parameters the call's metadata forwards: pseudo-headers and the gRPC protocol's
    own fields are not metadata, and are never forwarded."""
    return header_forward.parameters(
        (name, value) for name, value in call.headers.items()
        if not name.startswith(":") and name not in _TRANSPORT_HEADERS)


async def decode_request(service: InferenceService, message: Any,
                         shared_memory: SharedMemoryRegistry | None = None
                         ) -> InferenceRequest:
    """Decode a ModelInferRequest for the model version it names, which must be ready: the
    inputs are checked against it before any data is decoded, and a big message is decoded
    off the event loop."""
    model, request = _decode_on_loop(service, message, shared_memory)
    if request is None:
        request = await offload.run(codec.decode_infer_request, message, model, shared_memory)
    return request


def _decode_on_loop(service: InferenceService, message: Any,
                    shared_memory: SharedMemoryRegistry | None
                    ) -> tuple[ModelHandle, InferenceRequest | None]:
    """The model the message names, and the request decoded here, or None when its inputs
    claim more than a decode on the event loop may take (then it is decoded off it)."""
    model = service.model(message.model_name, codec.parse_version(message.model_version))
    return model, codec.decode_small_request(message, model, shared_memory,
                                             offload.INLINE_BYTES)


class HealthServicer:
    """``grpc.health.v1.Health/Check``: SERVING exactly when the server is ready."""

    def __init__(self, service: InferenceService):
        self.service = service

    async def Check(self, request: Any, call: Call) -> health_pb2.HealthCheckResponse:
        if request.service not in ("", SERVICE_NAME):
            raise TritiumError(ErrorCode.NOT_FOUND, f"unknown service '{request.service}'")
        serving = self.service.is_ready()
        status = health_pb2.HealthCheckResponse.SERVING if serving else (
            health_pb2.HealthCheckResponse.NOT_SERVING)
        return health_pb2.HealthCheckResponse(status=status)


def router(servicer: InferenceServicer, health: HealthServicer) -> Router:
    """Every method of the inference service, taken from its generated descriptor so none
    is missed, and the health check."""
    routes: Router = {}
    for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        request_type = getattr(pb, method.input_type.name)
        handler = getattr(servicer, method.name)
        if method.client_streaming:
            routes[f"/{SERVICE_NAME}/{method.name}"] = Rpc(request_type, stream=handler)
        else:
            routes[f"/{SERVICE_NAME}/{method.name}"] = Rpc(request_type, unary=handler)
    routes["/grpc.health.v1.Health/Check"] = Rpc(health_pb2.HealthCheckRequest,
                                                  unary=health.Check)
    return routes
