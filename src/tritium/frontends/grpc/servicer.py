"""gRPC methods: each decodes, calls ``core.InferenceService``, and encodes."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeAlias, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from tritium.core.cancellation import CancelReason
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.request import InferenceRequest
from tritium.core.response import ResponseStream
from tritium.core.service import InferenceService
from tritium.frontends.grpc import codec
from tritium.frontends.grpc.status import grpc_status

log = logging.getLogger("tritium.grpc")

# grpc ships no type information, so its context is typed loosely.
Context: TypeAlias = Any  # grpc.aio.ServicerContext
Reply = TypeVar("Reply")
Method = Callable[[Any, Any, Context], Awaitable[Reply]]

SERVICE_NAME = "inference.GRPCInferenceService"
_SHARED_MEMORY = TritiumError(
    ErrorCode.UNSUPPORTED, "shared memory is not supported by this server; send tensor data "
    "in the request instead"
)


async def abort(context: Context, error: TritiumError) -> NoReturn:
    await context.abort(grpc_status(error.code), error.message)
    raise AssertionError("context.abort returned")  # it always raises


def core_errors(method: Method[Reply]) -> Method[Reply]:
    """End the RPC with the gRPC status of a TritiumError the method raised."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: Context) -> Reply:
        try:
            return await method(self, request, context)
        except TritiumError as exc:
            await abort(context, exc)

    return wrapper


DEADLINE_SLACK_S = 0.1


def cancel_reason(context: Context, stopping: bool) -> CancelReason:
    """Why an RPC ended early: server shutdown, its deadline, or the client leaving."""
    if stopping:
        return CancelReason.SHUTDOWN
    remaining = context.time_remaining()
    # The client's deadline ends its call (an RST_STREAM that arrives here) a little before
    # the server's copy of it, which started counting only when the call arrived.
    if remaining is not None and remaining <= DEADLINE_SLACK_S:
        return CancelReason.DEADLINE
    return CancelReason.CLIENT_CANCELLED


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    """``inference.GRPCInferenceService`` over one ``InferenceService``."""

    def __init__(self, service: InferenceService):
        self.service = service
        self.stopping = False  # set by GrpcServer.stop: cancelled RPCs are then SHUTDOWN

    # -- health and metadata ---------------------------------------------------
    async def ServerLive(self, request: Any, context: Context) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.service.is_live())

    async def ServerReady(self, request: Any, context: Context) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.service.is_ready())

    @core_errors
    async def ModelReady(self, request: Any, context: Context) -> pb.ModelReadyResponse:
        # An unknown model is "not ready", not an error, as in Triton.
        version = codec.parse_version(request.version)
        return pb.ModelReadyResponse(ready=self.service.model_ready(request.name, version))

    async def ServerMetadata(self, request: Any, context: Context) -> pb.ServerMetadataResponse:
        return codec.encode_server_metadata(self.service.server_metadata())

    @core_errors
    async def ModelMetadata(self, request: Any, context: Context) -> pb.ModelMetadataResponse:
        version = codec.parse_version(request.version)
        return codec.encode_model_metadata(self.service.model_metadata(request.name, version))

    @core_errors
    async def ModelConfig(self, request: Any, context: Context) -> pb.ModelConfigResponse:
        model = self.service.model(request.name, codec.parse_version(request.version))
        return pb.ModelConfigResponse(config=model.config)

    @core_errors
    async def ModelStatistics(self, request: Any, context: Context) -> Any:
        entries = self.service.model_statistics(
            request.name or None, codec.parse_version(request.version))
        return codec.encode_model_statistics(entries)

    # -- repository ------------------------------------------------------------
    @core_errors
    async def RepositoryIndex(self, request: Any, context: Context) -> Any:
        return codec.encode_repository_index(self.service.repository_index(request.ready))

    @core_errors
    async def RepositoryModelLoad(self, request: Any, context: Context) -> Any:
        parameters = codec.decode_repository_parameters(request.parameters)
        await self.service.load_model(request.model_name, parameters)
        return pb.RepositoryModelLoadResponse()

    @core_errors
    async def RepositoryModelUnload(self, request: Any, context: Context) -> Any:
        parameters = codec.decode_repository_parameters(request.parameters)
        await self.service.unload_model(request.model_name, parameters)
        return pb.RepositoryModelUnloadResponse()

    # -- settings --------------------------------------------------------------
    @core_errors
    async def LogSettings(self, request: Any, context: Context) -> pb.LogSettingsResponse:
        changes = codec.decode_log_settings(request)  # none: a read
        settings = self.service.update_log_settings(changes) if changes else \
            self.service.log_settings()
        return codec.encode_log_settings(settings)

    @core_errors
    async def TraceSetting(self, request: Any, context: Context) -> pb.TraceSettingResponse:
        changes = codec.decode_trace_settings(request)
        model = request.model_name or None
        settings = self.service.update_trace_settings(changes, model) if changes else \
            self.service.trace_settings(model)
        return codec.encode_trace_settings(settings)

    # -- shared memory: not offered (and not listed in the server's extensions) --
    @core_errors
    async def SystemSharedMemoryStatus(self, request: Any, context: Context) -> Any:
        raise _SHARED_MEMORY

    @core_errors
    async def SystemSharedMemoryRegister(self, request: Any, context: Context) -> Any:
        raise _SHARED_MEMORY

    @core_errors
    async def SystemSharedMemoryUnregister(self, request: Any, context: Context) -> Any:
        raise _SHARED_MEMORY

    @core_errors
    async def CudaSharedMemoryStatus(self, request: Any, context: Context) -> Any:
        raise _SHARED_MEMORY

    @core_errors
    async def CudaSharedMemoryRegister(self, request: Any, context: Context) -> Any:
        raise _SHARED_MEMORY

    @core_errors
    async def CudaSharedMemoryUnregister(self, request: Any, context: Context) -> Any:
        raise _SHARED_MEMORY

    # -- inference -------------------------------------------------------------
    async def ModelInfer(self, message: Any, context: Context) -> pb.ModelInferResponse:
        try:
            request = codec.decode_infer_request(message)
        except TritiumError as exc:
            await abort(context, exc)
        request.cancellation = self.service.new_cancellation()
        try:
            response = await self.service.infer(request)
            return codec.encode_infer_response(response, request)
        except TritiumError as exc:
            await abort(context, exc)
        except asyncio.CancelledError:
            # The RPC ended under us: client cancel, deadline or a dropped connection.
            request.cancellation.cancel(cancel_reason(context, self.stopping))
            raise

    async def ModelStreamInfer(self, messages: AsyncIterator[Any], context: Context) -> None:
        session = StreamSession(self.service, context)
        try:
            await session.run(messages)
        except BaseException:
            session.cancel_all(cancel_reason(context, self.stopping))
            raise
        finally:
            session.close()


class StreamSession:
    """One ModelStreamInfer call: requests run concurrently, and their responses are
    written by this call's task alone, in the order they become ready."""

    def __init__(self, service: InferenceService, context: Context):
        self.service = service
        self.context = context
        # None wakes the writer to check whether the call is over.
        self.outbox: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
        self.in_flight: set[InferenceRequest] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.reading = True
        self.read_error: BaseException | None = None

    async def run(self, messages: AsyncIterator[Any]) -> None:
        """Returns once the client half-closed and every request has answered."""
        self._own(asyncio.ensure_future(self._read(messages)))
        await self._write()

    def close(self) -> None:
        """Stop this call's reader and forwarders (they are done unless it ended early)."""
        for task in list(self.tasks):
            task.cancel()

    def _own(self, task: asyncio.Task[None]) -> None:
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _write(self) -> None:
        outbox, write = self.outbox, self.context.write
        while True:
            message = await outbox.get()
            if message is not None:
                await write(message)
            elif self.read_error is not None:
                raise self.read_error
            elif not self.reading and not self.in_flight and outbox.empty():
                return

    async def _read(self, messages: AsyncIterator[Any]) -> None:
        try:
            async for message in messages:
                self._start(message)
        except Exception as exc:
            self.read_error = exc
        finally:
            # A half-close ends reading only: in-flight requests still answer.
            self.reading = False
            self.outbox.put_nowait(None)

    def _start(self, message: Any) -> None:
        try:
            request = codec.decode_infer_request(message)
            request.cancellation = self.service.new_cancellation()
            stream = self.service.submit(request)
        except TritiumError as exc:
            self.outbox.put_nowait(codec.encode_stream_error(exc, message.id))
            return
        self.in_flight.add(request)
        self._own(asyncio.ensure_future(self._forward(request, stream)))

    async def _forward(self, request: InferenceRequest, stream: ResponseStream) -> None:
        outbox = self.outbox
        try:
            async for response in stream:
                message = codec.encode_stream_response(response, request)
                if message is not None:
                    outbox.put_nowait(message)
        finally:
            self.in_flight.discard(request)
            outbox.put_nowait(None)

    def cancel_all(self, reason: CancelReason) -> None:
        """The call ended early: nobody will read what its requests would answer."""
        for request in list(self.in_flight):
            request.cancellation.cancel(reason)


class HealthServicer(health_pb2_grpc.HealthServicer):
    """``grpc.health.v1.Health/Check``: SERVING exactly when the server is ready."""

    def __init__(self, service: InferenceService):
        self.service = service

    async def Check(self, request: Any, context: Context) -> health_pb2.HealthCheckResponse:
        if request.service not in ("", SERVICE_NAME):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service '{request.service}'")
        serving = self.service.is_ready()
        status = health_pb2.HealthCheckResponse.SERVING if serving else (
            health_pb2.HealthCheckResponse.NOT_SERVING)
        return health_pb2.HealthCheckResponse(status=status)
