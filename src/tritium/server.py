"""Builds the server, runs it, and shuts it down in order."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tritium.config import GrpcLimitSettings, ServerConfig
from tritium.core import offload, summaries
from tritium.core.descriptors import default_connection_cap
from tritium.core.first_response import FirstResponseHistogram, configured_buckets
from tritium.core.header_forward import header_forward
from tritium.core.response_cache import ResponseCache
from tritium.core.restrictions import ApiGroup, by_group
from tritium.core.service import EXTENSIONS, InferenceService
from tritium.core.shared_memory import SharedMemoryRegistry, extensions
from tritium.ensemble.handle import EnsembleModel
from tritium.ensemble.plan import EnsemblePlan
from tritium.execution import placement as placement_module
from tritium.execution.kinds import InstanceBuilder
from tritium.execution.process import shm as process_shm
from tritium.frontends.grpc import restricted as grpc_restricted
from tritium.frontends.grpc.call import GrpcLimits
from tritium.frontends.grpc.flood import FloodLimits
from tritium.frontends.grpc.server import GrpcServer, start_grpc_server
from tritium.frontends.grpc.servicer import HealthServicer, InferenceServicer, router
from tritium.frontends.http import restricted as http_restricted
from tritium.frontends.http.handlers import HttpApi
from tritium.frontends.http.limits import HttpLimits
from tritium.frontends.http.transport import HttpServer, start_http_server
from tritium.metrics.server import MetricsOptions, MetricsServer
from tritium.repository import overrides
from tritium.repository.manager import ControlMode, ModelManager
from tritium.repository.poll import RepositoryPoller
from tritium.scheduling.rate_limiter import RateLimiter
from tritium.tls import TlsError, TlsSettings, server_context
from tritium.tracing import ServerTracer

log = logging.getLogger("tritium.server")

# After the exit timeout: time for cancelled requests' errors to reach their clients.
CLOSE_GRACE_S = 2.0
EXIT_IMMEDIATELY = 130


def run(config: ServerConfig) -> int:
    """Serve until SIGINT or SIGTERM; returns the process exit code."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        return asyncio.run(serve(config))
    return uvloop.run(serve(config))


async def serve(config: ServerConfig) -> int:
    loop = asyncio.get_running_loop()
    stop = _install_signal_handlers(loop, config.lame_duck_secs)
    _place_threads(loop)
    overrides.sweep_stale_dirs()
    shared_memory = SharedMemoryRegistry(config.allow_client_shm,
                                         key_prefix=config.client_shm_key_prefix)
    service, manager = _build_core(config, loop, shared_memory)

    await manager.load_startup_models(list(config.load_models))
    _log_models(manager)
    if _exits_on_load_failure(config, manager):
        await manager.shutdown()
        return 1
    try:
        http = await _start_http(config, service, shared_memory) if config.allow_http else None
        grpc = await _start_grpc(config, service, shared_memory) if config.allow_grpc else None
        metrics = await _start_metrics(config, manager) if config.allow_metrics else None
    except (OSError, TlsError) as exc:  # the port is taken, the address is not ours, ...
        log.error("cannot listen: %s", exc)
        await manager.shutdown()
        return 1
    poller = _start_poller(config, manager)
    # What startup built lives as long as the server: keep the collector from rescanning it.
    gc.freeze()
    log.info("server ready: %d model(s) loaded", len(manager.loaded_models()))

    await stop.wait()
    listeners = _Listeners(http, grpc, metrics)
    if stop.lame_duck:
        await _lame_duck(config.lame_duck_secs, service, listeners)
    code = await _shutdown(config, service, manager, listeners, poller)
    shared_memory.close()  # no request is left to read or write a region
    return code


def _exits_on_load_failure(config: ServerConfig, manager: ModelManager) -> bool:
    """--exit-on-error: a model of the startup set that failed stops the server."""
    failed = manager.failed_models()
    if failed and config.exit_on_error:
        log.error("failed to load all models (%s); exiting, as --exit-on-error is true",
                  ", ".join(failed))
        return True
    return False


def _place_threads(loop: asyncio.AbstractEventLoop) -> None:
    placement = placement_module.current()
    placement.settle()  # this thread is the event loop's
    executor = placement.unrestricted_executor()
    if executor is not None:
        # Worker threads read configs and may import model code: keep them unrestricted.
        loop.set_default_executor(executor)
        # Codec threads too: what they run is all CPU, best kept off the loop's core.
        offload.set_thread_initializer(placement.release)
    log.info("thread placement: %s", placement.describe())


def _build_core(config: ServerConfig, loop: asyncio.AbstractEventLoop,
                shared_memory: SharedMemoryRegistry) -> tuple[InferenceService, ModelManager]:
    from tritium.backends.python.link import LocalLink
    from tritium.backends.python.loader import auto_complete_config, create_python_backend

    service: InferenceService | None = None
    arena = config.process_arena  # --backend-config=python,shm-...
    process_shm.configure(arena.ring_bytes, arena.name_prefix)
    instances = InstanceBuilder(config.python_instance_kind, create_python_backend,
                                auto_complete_config)

    cache = ResponseCache(config.cache_bytes) if config.cache_bytes is not None else None

    def create_ensemble(plan: EnsemblePlan, model_config: Any, version: int) -> EnsembleModel:
        assert service is not None
        return EnsembleModel(plan, model_config, service, version, cache)

    manager = ModelManager(
        list(config.model_repositories), loop, instances,
        instances.auto_complete if config.auto_complete_config else None,
        config.model_control_mode, unload_timeout_s=config.exit_timeout_secs,
        create_ensemble=create_ensemble, load_concurrency=config.model_load_thread_count,
        load_retries=config.model_load_retry_count, response_cache=cache,
        config_name=config.model_config_name, namespacing=config.model_namespacing,
        rate_limiter=_rate_limiter(config), instrument=_latency_metrics(config),
    )
    service = InferenceService(manager, loop, extensions(EXTENSIONS, shared_memory),
                               config.server_id, config.strict_readiness,
                               tracer=ServerTracer(config.trace))
    instances.service, instances.link = service, LocalLink(service)
    service.note_log_file(config.log.file or "")
    service.update_log_settings({
        "log_info": config.log.info, "log_warning": config.log.warning,
        "log_error": config.log.error, "log_verbose_level": max(config.log_verbose, 0),
        "log_format": config.log.format})
    return service, manager


def _latency_metrics(config: ServerConfig) -> Callable[[Any], None] | None:
    """What each model version gets for --metrics-config's latency summaries and first
    response histogram, before it serves; a model asks nothing per request of either
    while it is off."""
    latency = config.features.metrics.latency
    if not config.allow_metrics:
        return None

    def instrument(model: Any) -> None:
        if latency.summaries:
            summaries.arm(model.statistics(), latency.quantiles,
                          cached=getattr(model, "cache", None) is not None)
        # Read whether or not the histogram is on: Triton warns of a family it cannot tune.
        buckets = configured_buckets(model.config, model.name)
        if latency.histograms and hasattr(model, "first_response"):
            model.first_response = FirstResponseHistogram(buckets)

    return instrument


def _rate_limiter(config: ServerConfig) -> RateLimiter | None:
    settings = config.features.rate_limit
    if settings.mode != "execution_count":
        return None  # off: instances run batches as soon as they are free
    return RateLimiter(settings.resources)


def _http_limits(config: ServerConfig) -> HttpLimits:
    return HttpLimits(
        max_body_bytes=config.http_max_input_size,
        header_timeout_s=config.http_header_timeout_secs,
        keepalive_timeout_s=config.http_keepalive_timeout_secs,
        body_timeout_s=config.http_body_timeout_secs,
        min_body_rate=config.http_min_body_rate,
        send_timeout_s=config.http_send_timeout_secs,
        max_connections=config.http_max_connections,
    )


async def _start_http(config: ServerConfig, service: InferenceService,
                      shared_memory: SharedMemoryRegistry) -> HttpServer:
    limits = _http_limits(config)
    forward = header_forward(config.http_header_forward_pattern)
    app = http_restricted.restrict(HttpApi(service, config.http_max_input_size, forward,
                                           config.openai_tokenizer, shared_memory),
                                   config.http_restricted_apis)
    server = await start_http_server(app, config.http_address, config.http_port, limits,
                                     ssl_context=_tls_context(config.http_tls, ["http/1.1"]))
    log.info("HTTP endpoint listening on %s:%d%s", config.http_address, server.port,
             _tls_note(config.http_tls))
    return server


async def _start_grpc(config: ServerConfig, service: InferenceService,
                      shared_memory: SharedMemoryRegistry) -> GrpcServer:
    servicer = InferenceServicer(service, header_forward(config.grpc_header_forward_pattern),
                                 shared_memory)
    routes = grpc_restricted.restrict(router(servicer, HealthServicer(service)),
                                      config.grpc_restricted_protocols)
    server = await start_grpc_server(routes, config.grpc_address, config.grpc_port,
                                     limits=grpc_limits(config.grpc_limits),
                                     ssl_context=_tls_context(config.grpc_tls, ["h2"]))
    log.info("gRPC endpoint listening on %s:%d%s", config.grpc_address, server.port,
             _tls_note(config.grpc_tls))
    return server


def grpc_limits(settings: GrpcLimitSettings) -> GrpcLimits:
    """The transport's limits from what the flags say."""
    return GrpcLimits(
        max_buffered_bytes=settings.max_buffered_bytes,
        max_peer_buffered_bytes=settings.max_peer_buffered_bytes,
        max_connection_buffered_bytes=min(settings.max_buffered_bytes,
                                          settings.max_peer_buffered_bytes),
        max_stream_requests=settings.max_stream_requests,
        preface_timeout_s=settings.preface_timeout_secs,
        idle_timeout_s=settings.idle_timeout_secs,
        message_progress_timeout_s=settings.message_timeout_secs,
        max_connections=settings.max_connections or default_connection_cap(),
        max_connection_age_s=_seconds(settings.max_connection_age_ms),
        max_connection_age_grace_s=_seconds(settings.max_connection_age_grace_ms),
        flood=FloodLimits(max_ping_strikes=settings.max_ping_strikes,
                          min_ping_interval_s=settings.min_ping_interval_ms / 1000))


def _seconds(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000


def _tls_context(settings: TlsSettings | None, alpn: list[str]) -> ssl.SSLContext | None:
    return None if settings is None else server_context(settings, alpn)


def _tls_note(settings: TlsSettings | None) -> str:
    if settings is None:
        return ""
    return " (TLS, client certificates required)" if settings.mutual else " (TLS)"


def _start_poller(config: ServerConfig, manager: ModelManager) -> RepositoryPoller | None:
    if config.model_control_mode is not ControlMode.POLL:
        return None
    if config.repository_poll_secs <= 0:
        log.warning("--model-control-mode=poll with --repository-poll-secs=%g: not polling",
                    config.repository_poll_secs)
        return None
    poller = RepositoryPoller(manager.sync_with_repository, config.repository_poll_secs)
    poller.start()
    log.info("polling the model repository every %g s", config.repository_poll_secs)
    return poller


async def _start_metrics(config: ServerConfig, manager: ModelManager) -> MetricsServer:
    from tritium.backends.python.metric import MetricFamily

    # Families that models create with pb_utils.MetricFamily appear next to Triton's.
    options = MetricsOptions(
        interval_s=config.metrics_interval_ms / 1000, cpu=config.allow_cpu_metrics,
        live_restriction=by_group(config.http_restricted_apis).get(ApiGroup.LIVE),
        latency=config.features.metrics.latency)
    server = MetricsServer(manager.loaded_models, custom=MetricFamily.snapshots,
                           catalog=manager, options=options)
    await server.start(config.metrics_address, config.metrics_port, _http_limits(config))
    log.info("metrics endpoint listening on %s:%d", config.metrics_address, server.port)
    return server


def _log_models(manager: ModelManager) -> None:
    for entry in manager.index(ready_only=False):
        version = "-" if entry.version is None else str(entry.version)
        reason = f" ({entry.reason})" if entry.reason else ""
        log.info("model '%s' version %s: %s%s", entry.name, version, entry.state.value, reason)


class _Stop:
    """Set by the first signal; a second signal ends the process at once.

    SIGTERM is what orchestrators and load balancers' owners send, so it begins with the
    lame duck; SIGINT is a person at a terminal, who wants the server gone now.
    """

    def __init__(self, lame_duck_secs: float) -> None:
        self.event = asyncio.Event()
        self.signals = 0
        self.lame_duck_secs = lame_duck_secs
        self.lame_duck = False

    def trigger(self, sig: signal.Signals) -> None:
        self.signals += 1
        if self.signals > 1:
            log.warning("second signal: exiting immediately")
            logging.shutdown()
            # Not SystemExit: interpreter teardown would wait on model and gRPC threads.
            os._exit(EXIT_IMMEDIATELY)
        self.lame_duck = sig is signal.SIGTERM and self.lame_duck_secs > 0
        log.info("%s received: shutting down", sig.name)
        self.event.set()

    async def wait(self) -> None:
        await self.event.wait()


def _install_signal_handlers(loop: asyncio.AbstractEventLoop, lame_duck_secs: float) -> _Stop:
    stop = _Stop(lame_duck_secs)
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.trigger, sig)
    return stop


@dataclass(frozen=True, slots=True)
class _Listeners:
    http: HttpServer | None
    grpc: GrpcServer | None
    metrics: MetricsServer | None


async def _lame_duck(seconds: float, service: InferenceService, listeners: _Listeners) -> None:
    """Report not ready while still serving everything, so that health-checking load
    balancers and Kubernetes endpoints take this server out before it refuses anything.

    Keep-alive clients are asked to reconnect (HTTP ``Connection: close`` on each next
    response, a graceful gRPC GOAWAY), which moves them off this server without an error.
    """
    service.start_leaving()
    log.info("lame duck: reporting not ready, still serving for %g s (--lame-duck-secs)",
             seconds)
    if listeners.http is not None:
        listeners.http.answer_last_exchanges()
    if listeners.grpc is not None:
        listeners.grpc.ask_clients_to_leave()
    await asyncio.sleep(seconds)
    if listeners.grpc is not None:
        # Still admitting: the calls of connections already taken, and those that crossed
        # a GOAWAY, are served rather than refused (a proxy cannot send them elsewhere).
        await listeners.grpc.stop_listening()
    log.info("lame duck over: %d request(s) in flight", len(service.in_flight()))


async def _shutdown(config: ServerConfig, service: InferenceService, manager: ModelManager,
                    listeners: _Listeners, poller: RepositoryPoller | None) -> int:
    """Refuse new work at once, drain what was admitted, cancel what outlives the exit
    timeout, finalize every model, then close the listeners.

    The HTTP listener stays open during the drain, so that probes and clients get a clear
    "not ready" / "shutting down" answer (503, which a proxy may retry elsewhere) instead
    of a refused connection; the gRPC listener closes at once, as a gRPC server's does,
    because the refusal a proxy can retry there is the refused connection (a gRPC call it
    has sent cannot be sent again).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + config.exit_timeout_secs
    service.stop_accepting()
    if listeners.grpc is not None:
        listeners.grpc.refuse_new_calls()
    log.info("shutting down: waiting up to %g s for %d in-flight request(s)",
             config.exit_timeout_secs, len(service.in_flight()))
    polling_stopped = loop.create_task(poller.stop()) if poller is not None else None
    report = await service.drain(max(deadline - loop.time(), 0.0))
    if report.cancelled:
        log.warning("exit timeout: cancelled %d request(s) still in flight", report.cancelled)
    # Cancelled clients still need their error written; give that a moment past the timeout.
    close_by = max(deadline, loop.time() + CLOSE_GRACE_S)
    await asyncio.gather(_close_http(listeners.http, close_by),
                         _close_grpc(listeners.grpc, close_by - loop.time()))
    if polling_stopped is not None:
        await polling_stopped
    await manager.shutdown()
    if isinstance(service.tracer, ServerTracer):
        await asyncio.to_thread(service.tracer.close)  # writes or exports what was traced
    if listeners.metrics is not None:
        await listeners.metrics.stop()
    log.info("shutdown complete: %d request(s) drained, %d cancelled",
             report.drained, report.cancelled)
    return 0


async def _close_http(http: HttpServer | None, close_by: float) -> None:
    """Stop listening and close each connection once it has no exchange in progress."""
    if http is None:
        return
    http.close()
    http.close_when_idle()
    try:
        async with asyncio.timeout_at(close_by):
            await http.wait_closed()
    except TimeoutError:
        log.warning("closing %d HTTP connection(s) still busy", http.active_connections())


async def _close_grpc(grpc: GrpcServer | None, grace_s: float) -> None:
    if grpc is not None:
        await grpc.stop(grace=max(grace_s, 0.0))
