"""``tritium serve`` and ``tritonserver``: tritonserver's flags, made a ``ServerConfig``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tritium import cli_features, cli_flags
from tritium.cli_values import triton_bool, verbose_level
from tritium.config import BUNDLED_REPOSITORY, GrpcLimitSettings, ServerConfig
from tritium.core import log_format
from tritium.core.header_forward import header_forward
from tritium.core.restrictions import (
    GROUP_NAMES,
    PROTOCOL_NAMES,
    Restriction,
    parse_restrictions,
)
from tritium.execution.placement import ThreadPlacement, install
from tritium.repository.manager import ControlMode
from tritium.tls import TlsError, TlsSettings, server_context


def _port(text: str) -> int:
    port = int(text)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be between 0 and 65535, got {port}")
    return port


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text}")
    return value


def _cores(text: str) -> frozenset[int]:
    """"0", "0,2", "0-3": the CPU cores the server may run on."""
    cores: set[int] = set()
    try:
        for part in text.split(","):
            low, _, high = part.partition("-")
            cores.update(range(int(low), int(high or low) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected core numbers like 0,2-3, got '{text}'") from None
    if not cores:
        raise argparse.ArgumentTypeError("expected at least one core")
    return frozenset(cores)


def _directory(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"'{text}' is not a directory")
    return path


def _thread_core(text: str) -> str:
    if text in ("auto", "none") or (text.isascii() and text.isdigit()):
        return text
    raise argparse.ArgumentTypeError(f"expected auto, none or a core number, got '{text}'")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tritium", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    # A short usage: the full list is what --help prints, not what every error repeats.
    add_serve_flags(commands.add_parser("serve", help="serve a Triton model repository",
                                        usage="tritium serve [options]"))
    return parser


def build_tritonserver_parser() -> argparse.ArgumentParser:
    """tritonserver's own command line: the same flags, no subcommand."""
    parser = argparse.ArgumentParser(
        prog="tritonserver", usage="tritonserver [options]",
        description="Serve Triton model repositories (tritium).")
    add_serve_flags(parser)
    return parser


def add_serve_flags(serve: argparse.ArgumentParser) -> None:
    add = serve.add_argument
    add("--model-repository", "--model-store", action="append", type=Path, dest="repositories",
        help=f"model repository directory, repeatable (default: {BUNDLED_REPOSITORY})")
    add("--http-address", default="0.0.0.0")
    add("--http-port", type=_port, default=8000, help="0 picks a free port")
    add("--grpc-address", default="0.0.0.0")
    add("--grpc-port", type=_port, default=8001, help="0 picks a free port")
    add("--metrics-address", default=None, help="defaults to --http-address")
    add("--metrics-port", type=_port, default=8002, help="0 picks a free port")
    add("--allow-http", type=triton_bool, default=True)
    add("--allow-grpc", type=triton_bool, default=True)
    add("--allow-metrics", type=triton_bool, default=True)
    add("--allow-client-shm", type=triton_bool, default=False,
        help="let clients register system shared memory regions (/v2/systemsharedmemory, "
             "SystemSharedMemory*) and pass tensors through them")
    add("--client-shm-key-prefix", default="",
        help="with --allow-client-shm: the prefix every region key must start with "
             "(default: any key of the server's user)")
    add("--model-control-mode", type=str.lower, choices=[m.value for m in ControlMode],
        default="none", help="none: load all at start; explicit: --load-model and the "
        "repository API; poll: also follow repository changes")
    add("--load-model", action="append", default=[], dest="load_models",
        help="model to load at startup in explicit mode, repeatable; '*' loads all")
    add("--repository-poll-secs", type=float, default=15.0,
        help="poll mode: seconds between repository scans (0 disables polling)")
    add("--exit-timeout-secs", type=float, default=30.0,
        help="how long shutdown (and an unload) waits for in-flight requests before "
        "cancelling them")
    add("--lame-duck-secs", type=_non_negative_float, default=5.0,
        help="on SIGTERM, report not ready but keep serving this long (so load balancers and "
             "Kubernetes endpoints stop sending here first), then stop admitting and drain; "
             "SIGINT skips it")
    add("--log-verbose", type=verbose_level, default=0,
        help="debug logging when > 0 (true and false mean 1 and 0)")
    add("--http-max-input-size", type=_positive, default=64 * 1024 * 1024,
        help="largest accepted HTTP request body, in bytes")
    add("--cpu-cores", type=_cores, default=None,
        help="run the server (and every thread it starts) on these cores only, e.g. 0 or 0-1; "
             "one core saves the cost of moving the GIL between cores for models that "
             "compute in Python, but starves models that compute in native threads")
    add("--python-threads-core", type=_thread_core, default="auto",
        help="the core the event loop and idle model instance threads share (model code "
             "itself runs on every core): auto (the idlest core at startup), a core "
             "number, or none to leave threads where the OS puts them")
    add("--python-instance-kind", choices=("thread", "process"), default="thread",
        help="where python models run by default: thread (a thread of the server, the "
             "lowest latency) or process (a process per instance, as Triton's stubs: "
             "parallel and isolated); a model's TRITIUM_INSTANCE_KIND parameter wins")
    add("--tokenizer", type=_directory, default=None,
        help="OpenAI API (/v1): a directory of Hugging Face tokenizer files "
             "(tokenizer_config.json with the chat template, tokenizer.json) for models "
             "whose own directory has none")
    _add_access_flags(serve)
    _add_http_limit_flags(serve)
    _add_grpc_limit_flags(serve)
    cli_flags.add_flags(serve)


def _add_grpc_limit_flags(serve: argparse.ArgumentParser) -> None:
    """tritonserver's ping-policy flags, and tritium's own bounds on a gRPC peer."""
    add = serve.add_argument
    add("--grpc-http2-max-ping-strikes", type=int, default=2,
        help="gRPC: pings sooner than the minimum interval (with no reply data between) that "
             "a client may send before its connection is closed with ENHANCE_YOUR_CALM")
    add("--grpc-http2-min-recv-ping-interval-without-data", type=_positive, default=300_000,
        metavar="MS", help="gRPC: the minimum interval between a client's pings, in ms")
    add("--grpc-max-connections", type=_positive, default=None,
        help="gRPC: most open connections; more are closed at once "
             "(default: a quarter of the open-file limit, ulimit -n)")
    add("--grpc-idle-timeout-secs", type=_positive_float, default=300.0,
        help="gRPC: a connection with no call for this long is closed with GOAWAY")
    add("--grpc-preface-timeout-secs", type=_positive_float, default=20.0,
        help="gRPC: a connection must send the HTTP/2 preface within this long")
    add("--grpc-message-timeout-secs", type=_positive_float, default=60.0,
        help="gRPC: a request message that stops arriving for this long ends its call")
    add("--grpc-max-buffered-bytes", type=_positive, default=3 * 2**31,
        help="gRPC: request bytes the server holds at most in messages not yet taken by their "
             "handlers (or being inflated), over all connections; a larger message is refused")
    add("--grpc-max-peer-buffered-bytes", type=_positive, default=2**31,
        help="gRPC: the share of --grpc-max-buffered-bytes one client address (all its "
             "connections together) may hold")
    add("--grpc-max-stream-requests", type=_positive, default=256,
        help="gRPC: requests one ModelStreamInfer call may have in flight; the client's "
             "further messages wait unread")


def _add_http_limit_flags(serve: argparse.ArgumentParser) -> None:
    """tritium's own: Triton has no flags for these bounds."""
    add = serve.add_argument
    add("--http-header-timeout-secs", type=_positive_float, default=30.0,
        help="HTTP (and metrics): a request line and headers must arrive within this long")
    add("--http-keepalive-timeout-secs", type=_positive_float, default=75.0,
        help="HTTP: an idle keep-alive connection is closed after this long")
    add("--http-body-timeout-secs", type=_positive_float, default=60.0,
        help="HTTP: a request body may pause this long at most; then 408 and close")
    add("--http-min-body-rate", type=_positive_float, default=240.0,
        help="HTTP: slowest average pace of a request body, bytes/s, after a 5 s grace; "
             "a slower body gets 408 and close")
    add("--http-send-timeout-secs", type=_positive_float, default=60.0,
        help="HTTP: a client that reads none of its response for this long is disconnected")
    add("--http-max-connections", type=_positive, default=None,
        help="HTTP: most open connections; more are answered 503 and closed "
             "(default: a quarter of the open-file limit, ulimit -n)")


def _add_access_flags(serve: argparse.ArgumentParser) -> None:
    add = serve.add_argument
    add("--http-restricted-api", action="append", default=[], metavar="API[,API...]:KEY=VALUE",
        help="serve these API groups only to requests with header KEY: VALUE; repeatable; "
             f"groups: {GROUP_NAMES}")
    add("--grpc-restricted-protocol", action="append", default=[],
        metavar="PROTOCOL[,PROTOCOL...]:KEY=VALUE",
        help="serve these gRPC groups only to calls with header triton-grpc-protocol-KEY: "
             f"VALUE; repeatable; groups: {PROTOCOL_NAMES}")
    for proto, name in (("grpc", "gRPC"), ("http", "HTTP")):
        add(f"--{proto}-header-forward-pattern", type=_forward_pattern, default="",
            metavar="REGEX", help=f"{name} request headers whose names match (anywhere, "
            "ignoring case unless it starts with (?-i)) reach the model as request "
            "parameters")
        add(f"--{proto}-use-ssl", type=triton_bool, default=False, help=f"serve {name} over TLS")
        add(f"--{proto}-use-ssl-mutual", type=triton_bool, default=False,
            help=f"serve {name} over TLS and require a client certificate signed by "
                 f"--{proto}-root-cert (implies --{proto}-use-ssl)")
        add(f"--{proto}-server-cert", type=Path, default=None, help="PEM server certificate")
        add(f"--{proto}-server-key", type=Path, default=None, help="PEM server private key")
        add(f"--{proto}-root-cert", type=Path, default=None,
            help="PEM root certificate that client certificates must be signed by")


def _forward_pattern(text: str) -> str:
    try:
        header_forward(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not an RE2 regular expression: {exc}") from None
    return text


def _restrictions(option: str, specs: list[str], feature: str) -> tuple[Restriction, ...]:
    try:
        return parse_restrictions(specs, feature)
    except ValueError as exc:
        raise SystemExit(f"tritium: error: --{option}: {exc}") from None


def _tls(args: argparse.Namespace, proto: str) -> TlsSettings | None:
    """The listener's TLS files, checked now so that a bad one stops startup in one line."""
    values = vars(args)
    mutual = values[f"{proto}_use_ssl_mutual"]
    if not (values[f"{proto}_use_ssl"] or mutual):
        return None  # tritonserver too ignores the file flags without TLS
    cert, key = values[f"{proto}_server_cert"], values[f"{proto}_server_key"]
    if cert is None or key is None:
        raise SystemExit(f"tritium: error: --{proto}-use-ssl needs --{proto}-server-cert "
                         f"and --{proto}-server-key")
    settings = TlsSettings(cert, key, values[f"{proto}_root_cert"], mutual)
    try:
        server_context(settings, [])
    except TlsError as exc:
        raise SystemExit(f"tritium: error: --{proto}-use-ssl: {exc}") from None
    return settings


def parse_config(argv: Sequence[str], command: str = "tritium") -> ServerConfig:
    return parse(argv, command)[0]


def parse(argv: Sequence[str], command: str = "tritium") -> tuple[ServerConfig, list[str]]:
    """The config, and the startup warnings about flags accepted without effect.

    ``command``: tritium (``serve ...``) or tritonserver (its defaults: exit on error).
    """
    parser = build_tritonserver_parser() if command == "tritonserver" else build_parser()
    args = parser.parse_args(argv)
    _check_triton_rules(parser, args)
    config = _config(parser, args, command)
    return config, cli_features.warnings(args, config.features.backends)


def _config(parser: argparse.ArgumentParser, args: argparse.Namespace,
            command: str) -> ServerConfig:
    repositories = tuple(args.repositories or [BUNDLED_REPOSITORY])
    for repo in repositories:
        if not repo.is_dir():
            raise SystemExit(
                f"tritium: error: model repository '{repo}' is not a readable directory"
            )
    return ServerConfig(
        model_repositories=repositories,
        http_address=args.http_address,
        http_port=args.http_port,
        grpc_address=args.grpc_address,
        grpc_port=args.grpc_port,
        metrics_address=args.metrics_address or args.http_address,
        metrics_port=args.metrics_port,
        allow_http=args.allow_http,
        allow_grpc=args.allow_grpc,
        allow_metrics=args.allow_metrics,
        allow_cpu_metrics=args.allow_metrics and args.allow_cpu_metrics is not False,
        metrics_interval_ms=args.metrics_interval_ms or 2000,
        model_control_mode=ControlMode(args.model_control_mode),
        load_models=tuple(args.load_models),
        repository_poll_secs=args.repository_poll_secs,
        exit_timeout_secs=args.exit_timeout_secs,
        lame_duck_secs=args.lame_duck_secs,
        log_verbose=args.log_verbose,
        http_max_input_size=args.http_max_input_size,
        http_header_timeout_secs=args.http_header_timeout_secs,
        http_keepalive_timeout_secs=args.http_keepalive_timeout_secs,
        http_body_timeout_secs=args.http_body_timeout_secs,
        http_min_body_rate=args.http_min_body_rate,
        http_send_timeout_secs=args.http_send_timeout_secs,
        http_max_connections=args.http_max_connections,
        grpc_limits=GrpcLimitSettings(
            max_ping_strikes=args.grpc_http2_max_ping_strikes,
            min_ping_interval_ms=args.grpc_http2_min_recv_ping_interval_without_data,
            max_connections=args.grpc_max_connections,
            idle_timeout_secs=args.grpc_idle_timeout_secs,
            preface_timeout_secs=args.grpc_preface_timeout_secs,
            message_timeout_secs=args.grpc_message_timeout_secs,
            max_buffered_bytes=args.grpc_max_buffered_bytes,
            max_peer_buffered_bytes=args.grpc_max_peer_buffered_bytes,
            max_stream_requests=args.grpc_max_stream_requests,
            max_connection_age_ms=args.grpc_max_connection_age,
            max_connection_age_grace_ms=args.grpc_max_connection_age_grace),
        cpu_cores=args.cpu_cores,
        python_threads_core=args.python_threads_core,
        python_instance_kind=args.python_instance_kind,
        http_restricted_apis=_restrictions("http-restricted-api", args.http_restricted_api, "api"),
        grpc_restricted_protocols=_restrictions(
            "grpc-restricted-protocol", args.grpc_restricted_protocol, "protocol"),
        http_tls=_tls(args, "http"),
        grpc_tls=_tls(args, "grpc"),
        http_header_forward_pattern=args.http_header_forward_pattern,
        grpc_header_forward_pattern=args.grpc_header_forward_pattern,
        openai_tokenizer=args.tokenizer,
        allow_client_shm=args.allow_client_shm,
        client_shm_key_prefix=args.client_shm_key_prefix,
        **_triton_settings(parser, args, exit_on_error=command == "tritonserver"),
    )


def _triton_settings(parser: argparse.ArgumentParser, args: argparse.Namespace,
                     exit_on_error: bool) -> dict[str, Any]:
    try:
        return cli_features.server_settings(args, exit_on_error)
    except cli_features.FlagError as exc:
        parser.error(str(exc))


def _check_triton_rules(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What tritonserver refuses after parsing, and the flags this server refuses."""
    if args.load_models and args.model_control_mode != ControlMode.EXPLICIT.value:
        parser.error("Use of '--load-model' requires setting '--model-control-mode=explicit' "
                     "as well.")
    if "*" in args.load_models and len(args.load_models) > 1:
        parser.error("Wildcard model name '*' must be the ONLY startup model if specified "
                     "at all.")
    refused = cli_flags.notices(args).refused
    if refused:
        parser.error("not supported: " + "; ".join(refused))


def _pin(cores: frozenset[int]) -> None:
    """Pin every thread there is (libraries start some at import) before the server starts
    more; threads inherit the mask of the thread that makes them."""
    try:
        for task in os.listdir("/proc/self/task"):
            os.sched_setaffinity(int(task), cores)
    except OSError as exc:
        raise SystemExit(
            f"tritium: error: cannot run on cores {sorted(cores)}: {exc.strerror}"
        ) from None


def main(argv: Sequence[str] | None = None) -> int:
    """``tritium serve ...``."""
    return _serve(*parse(sys.argv[1:] if argv is None else argv))


def tritonserver_main(argv: Sequence[str] | None = None) -> int:
    """``tritonserver ...``: tritonserver's command line and defaults."""
    return _serve(*parse(sys.argv[1:] if argv is None else argv, "tritonserver"))


def _serve(config: ServerConfig, warnings: list[str]) -> int:
    try:
        log_format.install(config.log.format,
                           logging.DEBUG if config.log_verbose > 0 else logging.INFO,
                           config.log.file)
    except OSError as exc:
        raise SystemExit(f"tritium: error: --log-file: {exc}") from None
    if config.log.warning:  # --log-warning=false hides these too
        for line in warnings:
            logging.getLogger("tritium.cli").warning("%s", line)
    if config.cpu_cores is not None:
        _pin(config.cpu_cores)
    try:
        install(ThreadPlacement.choose(config.python_threads_core))
    except ValueError as exc:
        raise SystemExit(f"tritium: error: --python-threads-core: {exc}") from None
    from tritium.server import run

    return run(config)
