"""tritonserver's flags that ``cli.py`` does not wire to a listener or a limit itself: what
each one does here, as data.

Every flag of ``tritonserver --help`` parses. Beyond that a flag is one of:
IMPLEMENTED (it does what it does in Triton), IGNORED (accepted, and meaningless by this
server's design: the warning says why), NO_SUCH_HARDWARE (cannot apply on this build: GPUs,
CUDA pools, backends other than python), NOT_YET (parsed into ``ServerConfig``, the feature
is not built yet) or REFUSED (the server does not start, and says why). ``applies`` narrows
a handling to the values it concerns: ``--allow-sagemaker=false`` asks for nothing.
"""

from __future__ import annotations

import argparse
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tritium import cli_values as v


class Handling(enum.Enum):
    IMPLEMENTED = "implemented"
    IGNORED = "accepted, meaningless here"
    NO_SUCH_HARDWARE = "accepted, cannot apply on this build"
    NOT_YET = "accepted, not yet honoured"
    REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class TritonFlag:
    name: str
    parse: Callable[[str], Any] | None  # None: the flag takes no value
    handling: Handling
    why: str
    repeat: bool = False
    applies: Callable[[Any], bool] | None = None  # None: every value


def _is_true(value: Any) -> bool:
    return value is True


def _not(default: Any) -> Callable[[Any], bool]:
    return lambda value: value != default


DONE, MEANINGLESS, NO_HW, LATER, REFUSE = (
    Handling.IMPLEMENTED, Handling.IGNORED, Handling.NO_SUCH_HARDWARE, Handling.NOT_YET,
    Handling.REFUSED)
_BACKEND = v.named_setting("backend-config", "backend name", True)
_GPU = "no GPU support in this build"
_LOOP = "one event loop serves every connection"
_NO_SAGEMAKER = "there is no SageMaker endpoint"
_NO_VERTEX = "there is no Vertex AI endpoint"
_KEEPALIVE = ("the server sends no keepalive pings; an idle connection closes after "
              "--grpc-idle-timeout-secs")

FLAGS: tuple[TritonFlag, ...] = (
    # -- server and logging
    TritonFlag("id", str, DONE, "the server name in server metadata"),
    TritonFlag("log-info", v.triton_bool, DONE, "write info-level records"),
    TritonFlag("log-warning", v.triton_bool, DONE, "write warning-level records"),
    TritonFlag("log-error", v.triton_bool, DONE, "write error-level records"),
    TritonFlag("log-format", v.choice("default", "ISO8601", "json", fold_case=False), DONE,
               "default, ISO8601, or json (one JSON object per record)"),
    TritonFlag("log-file", str, DONE,
               "write the log to this file instead of standard error"),
    # -- model repository
    TritonFlag("exit-on-error", v.triton_bool, DONE,
               "exit when a model of the startup set fails to load"),
    TritonFlag("disable-auto-complete-config", None, DONE,
               "use config.pbtxt as written: no auto_complete_config"),
    TritonFlag("strict-model-config", v.triton_bool, DONE,
               "deprecated inverse of auto-complete: true disables it"),
    TritonFlag("strict-readiness", v.triton_bool, DONE,
               "true: ready only while every model meant to be loaded is ready; "
               "false: ready while the server runs"),
    TritonFlag("model-load-thread-count", v.integer, DONE, "models loaded at the same time"),
    TritonFlag("model-load-retry-count", v.integer, DONE,
               "more tries for a version that fails to load"),
    TritonFlag("model-config-name", str, DONE,
               "each model's configs/<name>.pbtxt, where it has one, over its config.pbtxt"),
    TritonFlag("model-namespacing", v.triton_bool, DONE,
               "models of one name in different repositories; ensembles use their own"),
    TritonFlag("enable-peer-access", v.triton_bool, NO_HW, _GPU, applies=_is_true),
    # -- HTTP and gRPC
    TritonFlag("reuse-http-port", v.triton_bool, REFUSE,
               "several servers on one port are not supported: put replicas behind a load "
               "balancer or a Kubernetes Service", applies=_is_true),
    TritonFlag("reuse-grpc-port", v.triton_bool, REFUSE,
               "several servers on one port are not supported: put replicas behind a load "
               "balancer or a Kubernetes Service", applies=_is_true),
    TritonFlag("http-thread-count", v.integer, MEANINGLESS, _LOOP),
    TritonFlag("grpc-infer-thread-count", v.integer, MEANINGLESS, _LOOP),
    TritonFlag("grpc-infer-allocation-pool-size", v.integer, MEANINGLESS,
               "requests and responses are not pooled objects here"),
    TritonFlag("grpc-max-response-pool-size", v.integer, MEANINGLESS,
               "requests and responses are not pooled objects here"),
    TritonFlag("grpc-infer-response-compression-level", v.choice("none", "low", "medium",
                                                                 "high"),
               MEANINGLESS, "responses are sent uncompressed", applies=_not("none")),
    TritonFlag("grpc-keepalive-time", v.integer, MEANINGLESS, _KEEPALIVE),
    TritonFlag("grpc-keepalive-timeout", v.integer, MEANINGLESS, _KEEPALIVE),
    TritonFlag("grpc-keepalive-permit-without-calls", v.triton_bool, MEANINGLESS,
               _KEEPALIVE),
    TritonFlag("grpc-http2-max-pings-without-data", v.integer, MEANINGLESS, _KEEPALIVE),
    TritonFlag("grpc-max-connection-age", v.integer, DONE,
               "ms a connection lives before GOAWAY"),
    TritonFlag("grpc-max-connection-age-grace", v.integer, DONE,
               "ms its calls may run on after that GOAWAY"),
    # -- SageMaker and Vertex AI
    TritonFlag("allow-sagemaker", v.triton_bool, REFUSE,
               _NO_SAGEMAKER, applies=_is_true),
    TritonFlag("sagemaker-port", v.integer, MEANINGLESS, _NO_SAGEMAKER),
    TritonFlag("sagemaker-safe-port-range", v.pair(v.integer, v.integer, "-"), MEANINGLESS,
               _NO_SAGEMAKER),
    TritonFlag("sagemaker-thread-count", v.integer, MEANINGLESS, _NO_SAGEMAKER),
    TritonFlag("allow-vertex-ai", v.triton_bool, REFUSE,
               _NO_VERTEX, applies=_is_true),
    TritonFlag("vertex-ai-port", v.integer, MEANINGLESS, _NO_VERTEX),
    TritonFlag("vertex-ai-thread-count", v.integer, MEANINGLESS, _NO_VERTEX),
    TritonFlag("vertex-ai-default-model", str, MEANINGLESS, _NO_VERTEX),
    # -- metrics
    TritonFlag("allow-gpu-metrics", v.triton_bool, NO_HW, _GPU, applies=_is_true),
    TritonFlag("allow-cpu-metrics", v.triton_bool, DONE,
               "nv_cpu_utilization and nv_cpu_memory_*_bytes, read from /proc"),
    TritonFlag("metrics-interval-ms", v.positive_number, DONE,
               "how often per-interval metrics (CPU) and the live page's history are read"),
    TritonFlag("metrics-config", v.key_value("metrics-config"), DONE,
               "counter_latencies, summary_latencies, summary_quantiles, "
               "histogram_latencies", repeat=True),
    # -- tracing
    TritonFlag("trace-config", v.trace_setting, DONE, "tracing", repeat=True),
    TritonFlag("trace-file", str, DONE, "tracing"),
    TritonFlag("trace-level", v.trace_level, DONE, "tracing", repeat=True),
    TritonFlag("trace-rate", v.integer, DONE, "tracing"),
    TritonFlag("trace-count", v.integer, DONE, "tracing"),
    TritonFlag("trace-log-frequency", v.integer, DONE, "tracing"),
    # -- backends, repository agents, response cache
    TritonFlag("backend-directory", str, NO_HW,
               "only the built-in python backend runs here"),
    TritonFlag("backend-config", _BACKEND, DONE,
               "<backend>,<setting>=<value> or a global <setting>=<value>", repeat=True),
    TritonFlag("repoagent-directory", str, NO_HW, "repository agents are not supported"),
    TritonFlag("cache-config", v.named_setting("cache-config", "cache name", False), DONE,
               "the response cache: local,size=<bytes>", repeat=True),
    TritonFlag("response-cache-byte-size", v.integer, DONE,
               "the local response cache's size (older form of --cache-config)"),
    TritonFlag("cache-directory", str, NO_HW, "cache libraries are not loaded here"),
    # -- rate limiter
    TritonFlag("rate-limit", v.choice("execution_count", "off"), DONE,
               "execution_count: instances run as their groups' rate_limiter resources and "
               "priorities allow; off: as soon as they are free"),
    TritonFlag("rate-limit-resource", v.rate_limit_resource, DONE,
               "the count of a rate limiter resource, on one device or every device",
               repeat=True),
    # -- memory and devices
    TritonFlag("pinned-memory-pool-byte-size", v.integer, NO_HW, _GPU),
    TritonFlag("cuda-memory-pool-byte-size", v.pair(v.integer, v.integer, ":"), NO_HW, _GPU,
               repeat=True),
    TritonFlag("cuda-virtual-address-size", v.pair(v.integer, v.integer, ":"), NO_HW, _GPU,
               repeat=True),
    TritonFlag("min-supported-compute-capability", v.number, NO_HW, _GPU),
    TritonFlag("buffer-manager-thread-count", v.integer, MEANINGLESS,
               "tensor copies run on the request's own path"),
    TritonFlag("host-policy", v.named_setting("host-policy", "policy name", False), NO_HW,
               "host policies are not applied: use --cpu-cores", repeat=True),
    TritonFlag("model-load-gpu-limit", v.pair(v.integer, v.number, ":"), NO_HW, _GPU,
               repeat=True),
)


def dest(name: str) -> str:
    return name.replace("-", "_")


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Every flag of the table; each one's value is None unless given."""
    group = parser.add_argument_group("tritonserver flags (see the README's flag table)")
    for flag in FLAGS:
        help_text = f"{flag.why} [{flag.handling.value}]"
        if flag.parse is None:
            group.add_argument(f"--{flag.name}", action="store_true", default=None,
                               dest=dest(flag.name), help=help_text)
        elif flag.repeat:
            group.add_argument(f"--{flag.name}", type=flag.parse, action="append",
                               default=None, dest=dest(flag.name), help=help_text,
                               metavar="VALUE")
        else:
            group.add_argument(f"--{flag.name}", type=flag.parse, default=None,
                               dest=dest(flag.name), help=help_text, metavar="VALUE")


@dataclass(slots=True)
class Notices:
    """What the flags given ask for that this server does not do, by handling."""

    ignored: list[str]
    no_such_hardware: list[str]
    not_yet: list[str]
    refused: list[str]

    def warnings(self) -> list[str]:
        """At most one line per handling, each naming every flag it concerns."""
        lines = []
        if self.ignored:
            lines.append("flags accepted and ignored, meaningless for this server: "
                         + "; ".join(self.ignored))
        if self.no_such_hardware:
            lines.append("flags accepted and ignored, they cannot apply on this build: "
                         + "; ".join(self.no_such_hardware))
        if self.not_yet:
            lines.append("flags parsed but not yet honoured: " + "; ".join(self.not_yet))
        return lines


def notices(args: argparse.Namespace) -> Notices:
    found = Notices([], [], [], [])
    lists = {MEANINGLESS: found.ignored, NO_HW: found.no_such_hardware, LATER: found.not_yet,
             REFUSE: found.refused}
    for flag in FLAGS:
        given = getattr(args, dest(flag.name))
        if given is None or flag.handling is DONE:
            continue
        values = given if flag.repeat else [given]
        if flag.applies is not None and not any(flag.applies(value) for value in values):
            continue
        lists[flag.handling].append(f"--{flag.name} ({flag.why})")
    return found
