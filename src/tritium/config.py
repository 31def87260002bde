"""The server's settings, as the command line gives them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tritium.core.restrictions import Restriction
from tritium.feature_config import FeatureConfig, LogConfig, ProcessArenaSettings
from tritium.repository.manager import ControlMode
from tritium.tls import TlsSettings
from tritium.tracing.settings import TraceSettings

BUNDLED_REPOSITORY = Path(__file__).parent / "example_repository"


@dataclass(frozen=True, slots=True)
class GrpcLimitSettings:
    """What the flags say of the gRPC transport's bounds (frontends/grpc/call.py GrpcLimits)."""

    max_ping_strikes: int = 2
    min_ping_interval_ms: int = 300_000
    max_connections: int | None = None  # None: a quarter of the open-file limit
    idle_timeout_secs: float = 300.0
    preface_timeout_secs: float = 20.0
    message_timeout_secs: float = 60.0
    max_buffered_bytes: int = 3 * 2**31
    max_peer_buffered_bytes: int = 2**31
    max_stream_requests: int = 256
    max_connection_age_ms: int | None = None  # None: connections live as long as they like
    max_connection_age_grace_ms: int | None = None


@dataclass(frozen=True, slots=True)
class ServerConfig:
    model_repositories: tuple[Path, ...] = (BUNDLED_REPOSITORY,)
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 8002
    allow_http: bool = True
    allow_grpc: bool = True
    allow_metrics: bool = True
    allow_cpu_metrics: bool = True
    metrics_interval_ms: float = 2000  # how often CPU figures and the live page's history are read
    model_control_mode: ControlMode = ControlMode.NONE
    load_models: tuple[str, ...] = field(default_factory=tuple)
    repository_poll_secs: float = 15.0
    exit_timeout_secs: float = 30.0
    # On SIGTERM: seconds of "not ready, still serving" before admission stops (server.py).
    lame_duck_secs: float = 5.0
    log_verbose: int = 0
    http_max_input_size: int = 64 * 1024 * 1024
    http_header_timeout_secs: float = 30.0
    http_keepalive_timeout_secs: float = 75.0
    # tritium's own bounds on what an HTTP peer may hold (frontends/http/limits.py).
    http_body_timeout_secs: float = 60.0
    http_min_body_rate: float = 240.0
    http_send_timeout_secs: float = 60.0
    http_max_connections: int | None = None  # None: a quarter of the open-file limit
    grpc_limits: GrpcLimitSettings = field(default_factory=GrpcLimitSettings)
    cpu_cores: frozenset[int] | None = None
    python_threads_core: str = "auto"  # see execution/placement.py
    python_instance_kind: str = "thread"  # see execution/kinds.py
    # Access control: groups served only with a header (core/restrictions.py), and TLS.
    http_restricted_apis: tuple[Restriction, ...] = ()
    grpc_restricted_protocols: tuple[Restriction, ...] = ()
    http_tls: TlsSettings | None = None
    grpc_tls: TlsSettings | None = None
    # Header names (a regular expression) forwarded to models as request parameters.
    http_header_forward_pattern: str = ""
    grpc_header_forward_pattern: str = ""
    # OpenAI API (/v1): a directory of Hugging Face tokenizer files (tokenizer_config.json,
    # tokenizer.json) for the models whose own directory has none.
    openai_tokenizer: Path | None = None
    # Clients may register system shared memory regions (off by default, as in Triton 2.73).
    allow_client_shm: bool = False
    # tritonserver's server and repository flags (cli_flags.py says what each does here).
    server_id: str = "triton"
    strict_readiness: bool = True
    exit_on_error: bool = False  # the tritonserver command's default is True, as Triton's
    auto_complete_config: bool = True
    model_load_thread_count: int | None = None  # None: every model of a batch at once
    model_load_retry_count: int = 0
    log: LogConfig = field(default_factory=LogConfig)
    features: FeatureConfig = field(default_factory=FeatureConfig)
    process_arena: ProcessArenaSettings = field(default_factory=ProcessArenaSettings)
    # The response cache's size in bytes (--cache-config local,size=N); None: no cache.
    cache_bytes: int | None = None
    # --model-config-name: a model's configs/<name>.pbtxt, where it has one, over config.pbtxt.
    model_config_name: str | None = None
    # --model-namespacing: a model name may be in several repositories.
    model_namespacing: bool = False
    # --trace-config: Triton's trace modes and settings (tracing/settings.py).
    trace: TraceSettings = field(default_factory=TraceSettings)
    # --client-shm-key-prefix: the keys a client may register shared memory under.
    client_shm_key_prefix: str = ""
