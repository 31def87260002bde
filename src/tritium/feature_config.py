"""Structured settings from tritonserver's multi-part flags (tracing, response cache, rate
limiter, metrics, backends, logging), as ``ServerConfig`` holds them."""

from __future__ import annotations

from dataclasses import dataclass, field

Pairs = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class LogConfig:
    """--log-*: which levels the server writes, how, and where (None: standard error);
    --log-verbose is ``ServerConfig.log_verbose``."""

    info: bool = True
    warning: bool = True
    error: bool = True
    format: str = "default"  # default, ISO8601 or json
    file: str | None = None


@dataclass(frozen=True, slots=True)
class TraceConfig:
    """--trace-config and the older --trace-* flags, merged as tritonserver merges them."""

    mode: str = "triton"
    level: tuple[str, ...] = ("OFF",)
    rate: int = 1000
    count: int = -1
    # Mode-specific settings as given (triton: file, log-frequency; opentelemetry: url,
    # resource, bsp_*), by mode.
    modes: tuple[tuple[str, Pairs], ...] = ()

    @property
    def enabled(self) -> bool:
        return any(level != "OFF" for level in self.level)

    def settings(self, mode: str) -> dict[str, str]:
        return dict(next((pairs for name, pairs in self.modes if name == mode), ()))


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """--cache-config (or the older --response-cache-byte-size): one cache and its
    settings; None in ``ServerConfig`` means no response cache."""

    name: str
    settings: Pairs = ()


@dataclass(frozen=True, slots=True)
class RateLimitConfig:
    """--rate-limit and --rate-limit-resource (device -1: every device)."""

    mode: str = "off"  # off or execution_count
    resources: tuple[tuple[str, int, int], ...] = ()


# Triton's summary quantiles and the error each is asked with.
DEFAULT_QUANTILES: tuple[tuple[float, float], ...] = (
    (0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001), (0.999, 0.001))


@dataclass(frozen=True, slots=True)
class LatencyMetrics:
    """--metrics-config: how per-model latencies are exposed."""

    counters: bool = True  # counter_latencies: the nv_inference_*_duration_us counters
    summaries: bool = False  # summary_latencies
    quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES  # summary_quantiles
    histograms: bool = False  # histogram_latencies: first response histogram


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    allow_cpu_metrics: bool = True
    interval_ms: float = 2000.0
    settings: Pairs = ()  # --metrics-config, as given
    latency: LatencyMetrics = field(default_factory=LatencyMetrics)


@dataclass(frozen=True, slots=True)
class BackendConfig:
    """--backend-config: the global settings and each backend's own, as given."""

    global_settings: Pairs = ()
    by_backend: tuple[tuple[str, Pairs], ...] = ()

    def of(self, backend: str) -> dict[str, str]:
        """``backend``'s settings over the global ones, as Triton hands them to it."""
        merged = dict(self.global_settings)
        for name, pairs in self.by_backend:
            if name == backend:
                merged.update(pairs)
        return merged

    def backends(self) -> list[str]:
        return [name for name, _ in self.by_backend]


@dataclass(frozen=True, slots=True)
class ProcessArenaSettings:
    """What --backend-config=python,... sets of the process instance kind."""

    ring_bytes: int | None = None  # shm-default-byte-size; None: the built-in size
    name_prefix: str = "tritium-"  # shm-region-prefix-name


@dataclass(frozen=True, slots=True)
class FeatureConfig:
    """The settings of features that are parsed whether or not this build honours them."""

    trace: TraceConfig = field(default_factory=TraceConfig)
    cache: CacheConfig | None = None
    rate_limit: RateLimitConfig = field(default_factory=RateLimitConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    backends: BackendConfig = field(default_factory=BackendConfig)
    host_policies: tuple[tuple[str, str, str], ...] = ()


def group(settings: list[tuple[str, str, str]]) -> tuple[Pairs, tuple[tuple[str, Pairs], ...]]:
    """``(name, key, value)`` triples → the global pairs, and each name's pairs in order."""
    global_pairs = tuple((k, v) for name, k, v in settings if not name)
    names = list(dict.fromkeys(name for name, _, _ in settings if name))
    by_name = tuple((n, tuple((k, v) for name, k, v in settings if name == n)) for n in names)
    return global_pairs, by_name
