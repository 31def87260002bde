"""Turns the parsed multi-part flags into ``feature_config`` settings, merging the older
flags into the newer ones as tritonserver does (the newer one wins)."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from tritium import cli_flags
from tritium.cli_values import trace_level, trace_mode
from tritium.feature_config import (
    BackendConfig,
    CacheConfig,
    FeatureConfig,
    LatencyMetrics,
    LogConfig,
    MetricsConfig,
    ProcessArenaSettings,
    RateLimitConfig,
    TraceConfig,
    group,
)
from tritium.tracing.settings import TraceSettings

MIB = 1 << 20
# python backend settings that mean nothing for this server's instance processes, and why.
_PYTHON_IGNORED = {
    "shm-growth-byte-size": "the arena maps its whole capacity up front (sparse memory), "
                            "so it never grows",
    "stub-timeout-seconds": "an instance process's death is seen at once on its socket; "
                            "there is no health poll to time out",
    "thread-pool-size": "an instance process runs one request batch at a time",
    "shm-message-queue-size": "messages to an instance process go over a socket, not a "
                              "shared-memory queue",
}
# Settings Triton hands every backend that its python backend does not read either.
_PYTHON_SILENT = frozenset({"default-max-batch-size"})


class FlagError(ValueError):
    """A flag's value that parsed but cannot be used; the message names the flag."""


def server_settings(args: argparse.Namespace, exit_on_error: bool) -> dict[str, Any]:
    """``ServerConfig``'s fields from tritonserver's server, repository, log and
    multi-part flags; ``exit_on_error`` is the command's default."""
    settings = features(args)
    threads = args.model_load_thread_count
    return {
        "server_id": args.id if args.id is not None else "triton",
        "strict_readiness": args.strict_readiness is not False,
        "exit_on_error": exit_on_error if args.exit_on_error is None else args.exit_on_error,
        "auto_complete_config": auto_complete(args),
        "model_load_thread_count": None if threads is None else max(threads, 1),
        "model_load_retry_count": max(args.model_load_retry_count or 0, 0),
        "log": log_config(args),
        "features": settings,
        "process_arena": python_backend(settings.backends)[0],
        "cache_bytes": cache_bytes(settings.cache),
        "trace": trace_settings(settings.trace),
        "model_config_name": args.model_config_name or None,
        "model_namespacing": args.model_namespacing is True,
    }


def trace_settings(trace: TraceConfig) -> TraceSettings:
    """The tracer's settings from the merged tracing flags."""
    pairs = [f"mode={trace.mode}", *(f"level={level}" for level in trace.level),
             f"rate={trace.rate}", f"count={trace.count}"]
    pairs += [f"{mode},{key}={value}" for mode, settings in trace.modes
              for key, value in settings]
    try:
        return TraceSettings.from_flags(pairs)
    except ValueError as exc:
        raise FlagError(f"--trace-config: {exc}") from None


def cache_bytes(cache: CacheConfig | None) -> int | None:
    """The local response cache's size in bytes; None when no cache is configured."""
    if cache is None:
        return None
    if cache.name != "local":
        raise FlagError(f"--cache-config: '{cache.name}' caches are not supported here; "
                        "the local cache is (local,size=<bytes>)")
    settings = dict(cache.settings)
    unknown = sorted(set(settings) - {"size"})
    if unknown:
        raise FlagError(f"--cache-config: unknown local cache setting(s) {', '.join(unknown)}")
    try:
        size = int(settings.get("size", ""))
    except ValueError:
        raise FlagError("--cache-config local needs size=<bytes>, a non-negative "
                        "integer") from None
    if size < 0:
        raise FlagError("--cache-config local size must not be negative")
    return size


def warnings(args: argparse.Namespace, backends: BackendConfig) -> list[str]:
    """One line per kind of flag given that this server accepts without doing it
    (``backends``: the --backend-config settings the config was built with)."""
    found = cli_flags.notices(args)
    found.no_such_hardware.extend(other_backends(backends))
    found.ignored.extend(python_backend(backends)[1])
    deprecated = []
    if args.strict_model_config is not None:
        deprecated.append("'--strict-model-config' is deprecated (it still works): use "
                          "'--disable-auto-complete-config' instead")
    ignored = metrics_latency(tuple(args.metrics_config or ()))[1]
    metrics = (["--metrics-config settings ignored, as tritonserver ignores them: "
                + "; ".join(ignored)] if ignored else [])
    return deprecated + found.warnings() + metrics


def features(args: argparse.Namespace) -> FeatureConfig:
    return FeatureConfig(
        trace=trace_config(args),
        cache=cache_config(args),
        rate_limit=RateLimitConfig(args.rate_limit or "off",
                                   tuple(args.rate_limit_resource or ())),
        metrics=MetricsConfig(
            allow_cpu_metrics=bool(args.allow_metrics and args.allow_cpu_metrics is not False),
            interval_ms=args.metrics_interval_ms if args.metrics_interval_ms is not None
            else 2000.0,
            settings=tuple(args.metrics_config or ()),
            latency=metrics_latency(tuple(args.metrics_config or ()))[0]),
        backends=BackendConfig(*group(list(args.backend_config or []))),
        host_policies=tuple(args.host_policy or ()),
    )


_METRICS_KEYS = ("counter_latencies", "summary_latencies", "summary_quantiles",
                 "histogram_latencies")


def metrics_latency(pairs: tuple[tuple[str, str], ...]) -> tuple[LatencyMetrics, list[str]]:
    """--metrics-config as tritonserver reads it, and a note for each setting it ignores:
    an unknown key, a switch that is neither true nor false (only ``false`` turns the
    counters off, only ``true`` turns summaries or histograms on), a quantile pair that
    does not parse. A quantile or error outside [0, 1] is refused."""
    latency = LatencyMetrics()
    notes: list[str] = []
    for key, value in pairs:
        if key not in _METRICS_KEYS:
            notes.append(f"{key}={value} (not a metrics setting: {', '.join(_METRICS_KEYS)})")
        elif key == "summary_quantiles":
            quantiles = _quantiles(value, notes)
            if quantiles:
                latency = replace(latency, quantiles=quantiles)
        elif value not in ("true", "false"):
            notes.append(f"{key}={value} (expected true or false)")
        elif key == "counter_latencies" and value == "false":
            latency = replace(latency, counters=False)
        elif key == "summary_latencies" and value == "true":
            latency = replace(latency, summaries=True)
        elif key == "histogram_latencies" and value == "true":
            latency = replace(latency, histograms=True)
    return latency, notes


def _quantiles(text: str, notes: list[str]) -> tuple[tuple[float, float], ...]:
    """``q:err,...``; a pair that does not parse is skipped, as tritonserver skips it."""
    found = []
    for pair in text.split(","):
        head, colon, tail = pair.partition(":")
        if not colon:
            notes.append(f"summary_quantiles: Invalid option: [{pair}]. No ':' delimiter "
                         "found. Expected format is <quantile>:<error>")
            continue
        try:
            quantile, error = float(head), float(tail)
        except ValueError:
            notes.append(f"summary_quantiles: Invalid option: [{pair}]. Expected numbers "
                         "<quantile>:<error>")
            continue
        if not (0 <= quantile <= 1 and 0 <= error <= 1):
            raise FlagError(f"--metrics-config summary_quantiles: quantile and error must "
                            f"be between 0 and 1, got '{pair}'")
        found.append((quantile, error))
    return tuple(found)


def log_config(args: argparse.Namespace) -> LogConfig:
    def on(value: bool | None) -> bool:
        return True if value is None else value

    return LogConfig(info=on(args.log_info), warning=on(args.log_warning),
                     error=on(args.log_error), format=args.log_format or "default",
                     file=args.log_file or None)


def auto_complete(args: argparse.Namespace) -> bool:
    """--disable-auto-complete-config wins over the older --strict-model-config=false."""
    if args.disable_auto_complete_config:
        return False
    return args.strict_model_config is not True


def trace_config(args: argparse.Namespace) -> TraceConfig:
    settings: list[tuple[str, str, str]] = list(args.trace_config or [])
    global_pairs, modes = group(settings)
    levels = list(args.trace_level or [])
    rate = _int(args.trace_rate, 1000)
    count = _int(args.trace_count, -1)
    mode = "triton"
    for key, value in global_pairs:
        if key == "level":
            levels.append(_checked(trace_level, value, "level"))
        elif key == "rate":
            rate = _checked(int, value, "rate")
        elif key == "count":
            count = _checked(int, value, "count")
        elif key == "mode":
            mode = _checked(trace_mode, value, "mode")
        else:
            raise FlagError(f"--trace-config: unknown global setting '{key}' (rate, level, "
                            "count, mode; or <mode>,<setting>=<value>)")
    # An explicit OFF anywhere wins, as in tritonserver.
    off = "OFF" in levels or not levels
    level = ("OFF",) if off else tuple(dict.fromkeys(levels))
    triton = dict(next((pairs for name, pairs in modes if name == "triton"), ()))
    older = {"file": args.trace_file, "log-frequency": args.trace_log_frequency}
    for key, value in older.items():
        if value is not None and key not in triton:
            triton[key] = str(value)
    merged = [(n, p) for n, p in modes if n != "triton"]
    if triton:
        merged.append(("triton", tuple(triton.items())))
    return TraceConfig(mode=mode, level=level, rate=rate, count=count, modes=tuple(merged))


def _checked(parse: Any, value: str, key: str) -> Any:
    try:
        return parse(value)
    except (ValueError, argparse.ArgumentTypeError) as exc:
        raise FlagError(f'--trace-config {key}: {exc}') from None


def _int(value: int | None, default: int) -> int:
    return default if value is None else value


def cache_config(args: argparse.Namespace) -> CacheConfig | None:
    settings = list(args.cache_config or [])
    if settings and args.response_cache_byte_size is not None:
        raise FlagError("Incompatible flags --response-cache-byte-size and --cache-config "
                        "both provided. Please provide one or the other.")
    if args.response_cache_byte_size is not None:
        return CacheConfig("local", (("size", str(args.response_cache_byte_size)),))
    if not settings:
        return None
    _, caches = group(settings)
    if len(caches) > 1:
        raise FlagError("--cache-config: found multiple cache configurations, but only a "
                        "single cache is supported")
    name, pairs = caches[0]
    return CacheConfig(name, pairs)


def python_backend(backends: BackendConfig) -> tuple[ProcessArenaSettings, list[str]]:
    """The process arena's settings from --backend-config=python,...; and one note per
    setting accepted without effect."""
    ring_bytes: int | None = None
    prefix = ProcessArenaSettings().name_prefix
    notes: list[str] = []
    for key, value in backends.of("python").items():
        if key == "shm-default-byte-size":
            ring_bytes = _byte_size(key, value, MIB)
        elif key == "shm-region-prefix-name":
            prefix = _prefix(value)
        elif key in _PYTHON_IGNORED:
            _byte_size(key, value, 1)  # a bad number is still refused, as Triton does
            notes.append(f"--backend-config=python,{key} ({_PYTHON_IGNORED[key]})")
        elif key not in _PYTHON_SILENT:
            notes.append(f"--backend-config=python,{key} (not a python backend setting)")
    return ProcessArenaSettings(ring_bytes, prefix), notes


def _byte_size(key: str, value: str, least: int) -> int:
    try:
        size = int(value)
    except ValueError:
        size = -1
    if size < least:
        raise FlagError(f"--backend-config=python,{key}: expected an integer >= {least}, "
                        f"got '{value}'")
    return size


def _prefix(value: str) -> str:
    # It names memfds: one path component, no separators.
    if "/" in value or "\0" in value:
        raise FlagError("--backend-config=python,shm-region-prefix-name: no '/' allowed, "
                        f"got '{value}'")
    return value


def other_backends(backends: BackendConfig) -> list[str]:
    return [f"--backend-config={name},... (only the built-in python backend runs here)"
            for name in backends.backends() if name != "python"]
