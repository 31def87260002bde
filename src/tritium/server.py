"""Builds the server, runs it, and shuts it down in order."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import Any

from tritium.config import ServerConfig
from tritium.core.cancellation import CancelReason
from tritium.core.service import InferenceService
from tritium.execution.backend import InstanceInfo, ModelBackend
from tritium.frontends.grpc.server import GrpcServer, start_grpc_server
from tritium.frontends.http.handlers import HttpApi
from tritium.frontends.http.transport import HttpLimits, HttpServer, start_http_server
from tritium.metrics.server import MetricsServer
from tritium.repository.manager import ModelManager

log = logging.getLogger("tritium.server")


def run(config: ServerConfig) -> int:
    """Serve until SIGINT or SIGTERM; returns the process exit code."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        return asyncio.run(serve(config))
    return uvloop.run(serve(config))


async def serve(config: ServerConfig) -> int:
    loop = asyncio.get_running_loop()
    stop = _install_signal_handlers(loop)
    service, manager = _build_core(config, loop)

    await manager.load_startup_models(list(config.load_models))
    _log_models(manager)
    http = await _start_http(config, service) if config.allow_http else None
    grpc = await _start_grpc(config, service) if config.allow_grpc else None
    metrics = _start_metrics(config, manager) if config.allow_metrics else None
    log.info("server ready: %d model(s) loaded", len(manager.loaded_models()))

    await stop.wait()
    code = await _shutdown(config, service, manager, http, grpc)
    if metrics is not None:
        metrics.stop()
    return code


def _build_core(config: ServerConfig, loop: asyncio.AbstractEventLoop
                ) -> tuple[InferenceService, ModelManager]:
    from tritium.backends.python.loader import auto_complete_config, create_python_backend

    service: InferenceService | None = None

    def create_backend(info: InstanceInfo, model_config: Any) -> ModelBackend:
        assert service is not None
        return create_python_backend(info, model_config, service)

    manager = ModelManager(
        list(config.model_repositories), loop, create_backend, auto_complete_config,
        config.model_control_mode,
    )
    service = InferenceService(manager, loop)
    return service, manager


async def _start_http(config: ServerConfig, service: InferenceService) -> HttpServer:
    limits = HttpLimits(
        max_body_bytes=config.http_max_input_size,
        header_timeout_s=config.http_header_timeout_secs,
        keepalive_timeout_s=config.http_keepalive_timeout_secs,
    )
    app = HttpApi(service, config.http_max_input_size)
    server = await start_http_server(app, config.http_address, config.http_port, limits)
    log.info("HTTP endpoint listening on %s:%d", config.http_address, server.port)
    return server


async def _start_grpc(config: ServerConfig, service: InferenceService) -> GrpcServer:
    server = await start_grpc_server(service, config.grpc_address, config.grpc_port)
    log.info("gRPC endpoint listening on %s:%d", config.grpc_address, server.port)
    return server


def _start_metrics(config: ServerConfig, manager: ModelManager) -> MetricsServer:
    server = MetricsServer(manager.loaded_models, config.metrics_address, config.metrics_port)
    server.start()
    log.info("metrics endpoint listening on %s:%d", config.metrics_address, server.port)
    return server


def _log_models(manager: ModelManager) -> None:
    for entry in manager.index(ready_only=False):
        version = "-" if entry.version is None else str(entry.version)
        reason = f" ({entry.reason})" if entry.reason else ""
        log.info("model '%s' version %s: %s%s", entry.name, version, entry.state.value, reason)


class _Stop:
    """Set by the first signal; a second signal ends the process at once."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.signals = 0

    def trigger(self) -> None:
        self.signals += 1
        if self.signals > 1:
            log.warning("second signal: exiting immediately")
            raise SystemExit(1)
        self.event.set()

    async def wait(self) -> None:
        await self.event.wait()


def _install_signal_handlers(loop: asyncio.AbstractEventLoop) -> _Stop:
    stop = _Stop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.trigger)
    return stop


async def _shutdown(config: ServerConfig, service: InferenceService, manager: ModelManager,
                    http: HttpServer | None, grpc: GrpcServer | None) -> int:
    log.info("shutting down: waiting up to %.0f s for %d in-flight request(s)",
             config.exit_timeout_secs, len(service.in_flight()))
    service.accepting = False
    before = len(service.in_flight())
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(service.wait_idle(), config.exit_timeout_secs)
    cancelled = service.cancel_all(CancelReason.SHUTDOWN)
    await manager.shutdown()
    if http is not None:
        http.close()
        http.close_idle_connections()
    if grpc is not None:
        await grpc.stop(grace=1.0)
    log.info("shutdown complete: %d request(s) drained, %d cancelled",
             before - cancelled, cancelled)
    return 0
