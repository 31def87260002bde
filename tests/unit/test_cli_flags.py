"""tritonserver's command line: every flag of its --help parses with its own syntax, and
each one is implemented, accepted with a warning, or refused with a reason."""

from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path

import pytest

from tritium import cli_flags
from tritium.cli import build_tritonserver_parser, parse, parse_config, tritonserver_main
from tritium.config import BUNDLED_REPOSITORY

REPO = str(BUNDLED_REPOSITORY)

# Every flag tritonserver 2.51 lists in --help, then the ones 2.73 adds, each with a value
# it accepts (None: the flag takes none). Written out here, not read from a help text.
TRITONSERVER_2_51: list[tuple[str, str | None]] = [
    ("id", "replica-1"), ("exit-timeout-secs", "5"),
    ("log-verbose", "1"), ("log-info", "true"), ("log-warning", "false"),
    ("log-error", "on"), ("log-format", "ISO8601"), ("log-file", "/dev/null"),
    ("model-store", REPO), ("model-repository", REPO), ("exit-on-error", "false"),
    ("disable-auto-complete-config", None), ("strict-readiness", "false"),
    ("model-control-mode", "poll"), ("repository-poll-secs", "5"), ("load-model", "m"),
    ("model-load-thread-count", "2"), ("model-load-retry-count", "0"),
    ("model-namespacing", "false"), ("enable-peer-access", "true"),
    ("allow-http", "true"), ("http-address", "127.0.0.1"), ("http-port", "8080"),
    ("reuse-http-port", "false"), ("http-header-forward-pattern", "x-.*"),
    ("http-thread-count", "8"), ("http-restricted-api", "model-repository:admin=yes"),
    ("allow-grpc", "1"), ("grpc-address", "127.0.0.1"), ("grpc-port", "9000"),
    ("reuse-grpc-port", "off"), ("grpc-header-forward-pattern", "x-.*"),
    ("grpc-infer-allocation-pool-size", "8"), ("grpc-use-ssl", "false"),
    ("grpc-use-ssl-mutual", "false"), ("grpc-server-cert", "/tmp/cert.pem"),
    ("grpc-server-key", "/tmp/key.pem"), ("grpc-root-cert", "/tmp/ca.pem"),
    ("grpc-infer-response-compression-level", "none"), ("grpc-keepalive-time", "7200000"),
    ("grpc-keepalive-timeout", "20000"), ("grpc-keepalive-permit-without-calls", "0"),
    ("grpc-http2-max-pings-without-data", "2"),
    ("grpc-http2-min-recv-ping-interval-without-data", "300000"),
    ("grpc-http2-max-ping-strikes", "2"), ("grpc-max-connection-age", "60000"),
    ("grpc-max-connection-age-grace", "5000"),
    ("grpc-restricted-protocol", "model-repository:admin=yes"),
    ("allow-sagemaker", "false"), ("sagemaker-port", "8080"),
    ("sagemaker-safe-port-range", "8000-8100"), ("sagemaker-thread-count", "8"),
    ("allow-vertex-ai", "false"), ("vertex-ai-port", "8080"),
    ("vertex-ai-thread-count", "8"), ("vertex-ai-default-model", "m"),
    ("allow-metrics", "true"), ("allow-gpu-metrics", "false"),
    ("allow-cpu-metrics", "true"), ("metrics-address", "127.0.0.1"),
    ("metrics-port", "8002"), ("metrics-interval-ms", "2000"),
    ("metrics-config", "summary_latencies=true"),
    ("trace-config", "triton,file=/tmp/trace.json"),
    ("backend-directory", "/opt/tritonserver/backends"),
    ("backend-config", "python,shm-default-byte-size=4194304"),
    ("repoagent-directory", "/opt/tritonserver/repoagents"),
    ("cache-config", "local,size=1048576"), ("cache-directory", "/opt/tritonserver/caches"),
    ("rate-limit", "execution_count"), ("rate-limit-resource", "R1:10:0"),
    ("pinned-memory-pool-byte-size", "268435456"), ("cuda-memory-pool-byte-size", "0:67108864"),
    ("cuda-virtual-address-size", "0:1073741824"), ("min-supported-compute-capability", "6.0"),
    ("buffer-manager-thread-count", "0"), ("host-policy", "gpu_0,numa-node=0"),
    ("model-load-gpu-limit", "0:0.8"), ("strict-model-config", "false"),
    ("response-cache-byte-size", "1048576"), ("trace-file", "/tmp/trace.json"),
    ("trace-level", "TIMESTAMPS"), ("trace-rate", "1000"), ("trace-count", "-1"),
    ("trace-log-frequency", "0"),
]
TRITONSERVER_2_73: list[tuple[str, str | None]] = [
    ("http-max-input-size", "67108864"), ("grpc-infer-thread-count", "4"),
    ("grpc-max-response-pool-size", "16"), ("allow-client-shm", "false"),
    ("model-config-name", "h100"),
]
# Flags refused whatever their value (the rest are refused only for values that ask for
# something this server does not do).
ALWAYS_REFUSED: set[str] = set()
NEEDS = {"load-model": ["--model-control-mode=explicit"]}


def _argv(flag: str, value: str | None, joined: bool) -> list[str]:
    if value is None:
        return [f"--{flag}"]
    return [f"--{flag}={value}"] if joined else [f"--{flag}", value]


@pytest.mark.parametrize("joined", [True, False], ids=["flag=value", "flag value"])
@pytest.mark.parametrize(("flag", "value"), TRITONSERVER_2_51 + TRITONSERVER_2_73,
                         ids=[f for f, _ in TRITONSERVER_2_51 + TRITONSERVER_2_73])
def test_every_tritonserver_flag_parses(flag: str, value: str | None, joined: bool) -> None:
    argv = [*_argv(flag, value, joined), *NEEDS.get(flag, [])]
    config, _ = parse(argv, "tritonserver")
    assert config.model_repositories  # a whole config was built
    assert parse_config(["serve", *argv]) is not None  # and under `tritium serve` too


# tritium's own flags (its bounds, TLS for HTTP, placement, ...), beside tritonserver's.
TRITIUM_ONLY = {
    "help", "cpu-cores", "python-threads-core", "python-instance-kind",
    "tokenizer", "grpc-max-connections", "grpc-idle-timeout-secs",
    "grpc-preface-timeout-secs", "grpc-message-timeout-secs", "grpc-max-buffered-bytes",
    "grpc-max-stream-requests", "http-header-timeout-secs", "http-keepalive-timeout-secs",
    "http-body-timeout-secs", "http-min-body-rate", "http-send-timeout-secs",
    "http-max-connections", "http-use-ssl", "http-use-ssl-mutual", "http-server-cert",
    "http-server-key", "http-root-cert", "lame-duck-secs",
    "grpc-max-peer-buffered-bytes", "client-shm-key-prefix",
}


def test_the_fixture_covers_every_flag_the_parser_knows() -> None:
    listed = {flag for flag, _ in TRITONSERVER_2_51 + TRITONSERVER_2_73} | ALWAYS_REFUSED
    parser = build_tritonserver_parser()
    known = {option[2:] for action in parser._actions for option in action.option_strings}
    assert known - TRITIUM_ONLY - {""} == listed  # "" is -h


@pytest.mark.parametrize(("argv", "fragment"), [
    (["--allow-sagemaker=true"], "SageMaker"),
    (["--allow-vertex-ai", "1"], "Vertex AI"),
    (["--reuse-http-port=true"], "load balancer"),
    (["--load-model=m"], "requires setting '--model-control-mode=explicit'"),
    (["--model-control-mode=explicit", "--load-model=*", "--load-model=m"], "Wildcard"),
    (["--strict-readiness=maybe"], "invalid value for bool option"),
    (["--backend-config=,k=v"], "no backend name"),
    (["--backend-config=python,novalue"], "--backend-config takes"),
    (["--backend-config=python,shm-default-byte-size=1024"], ">= 1048576"),
    (["--cache-config=size=1"], "no cache name"),
    (["--cache-config=local,size=1", "--response-cache-byte-size=1"], "Incompatible flags"),
    (["--trace-config=jaeger,url=x"], "invalid value for trace mode"),
    (["--trace-config=level=LOUD"], "invalid value for trace level"),
    (["--rate-limit-resource=R1"], "<resource_name>:<count>"),
    (["--rate-limit=sometimes"], "expected one of execution_count, off"),
    (["--rate-limit-resource=R1:-1"], "count must not be negative"),
    (["--log-format=iso8601"], "expected one of default, ISO8601, json"),
    (["--cuda-memory-pool-byte-size=67108864"], "<first>:<second>"),
])
def test_refusals_exit_2_with_the_reason(argv: list[str], fragment: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse(argv, "tritonserver")
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("tritonserver: error:") and fragment in error, error


def test_booleans_read_as_tritonserver_reads_them() -> None:
    for text, expected in [("true", True), ("ON", True), ("1", True), ("False", False),
                           ("off", False), ("0", False)]:
        assert parse([f"--strict-readiness={text}"], "tritonserver")[0].strict_readiness \
            is expected
    assert parse(["--log-verbose=true"], "tritonserver")[0].log_verbose == 1


def test_the_deployments_command_lines() -> None:
    kserve = ["--model-store=/tmp", "--grpc-port=9000", "--http-port=8080",
              "--allow-grpc=true", "--allow-http=true"]
    config, warnings = parse(kserve, "tritonserver")
    assert (config.grpc_port, config.http_port, config.model_repositories) == (
        9000, 8080, (Path("/tmp"),))
    assert warnings == []
    modelmesh, _ = parse([*kserve, "--model-control-mode=explicit",
                          "--strict-readiness=false"], "tritonserver")
    assert modelmesh.strict_readiness is False
    helm, warnings = parse(["--model-repository=/tmp", "--strict-model-config=false",
                            "--log-verbose=1"], "tritonserver")
    assert helm.auto_complete_config is True and helm.log_verbose == 1
    assert len(warnings) == 1 and "--strict-model-config" in warnings[0]


def test_defaults_tritonserver_and_tritium() -> None:
    triton, _ = parse([], "tritonserver")
    tritium = parse_config(["serve"])
    assert triton.exit_on_error is True and tritium.exit_on_error is False
    assert triton.strict_readiness is tritium.strict_readiness is True
    assert triton.server_id == "triton"
    assert parse(["--id=r1"], "tritonserver")[0].server_id == "r1"


def test_auto_complete_flags() -> None:
    assert parse(["--disable-auto-complete-config"], "tritonserver")[0] \
        .auto_complete_config is False
    assert parse(["--strict-model-config=true"], "tritonserver")[0].auto_complete_config \
        is False
    # --disable-auto-complete-config wins over the older flag, as in tritonserver.
    both = ["--strict-model-config=false", "--disable-auto-complete-config"]
    assert parse(both, "tritonserver")[0].auto_complete_config is False


def test_one_warning_line_per_kind_of_flag() -> None:
    argv = ["--pinned-memory-pool-byte-size=1", "--cuda-memory-pool-byte-size=0:1",
            "--min-supported-compute-capability=7", "--backend-directory=/x",
            "--backend-config=tensorrt,coalesce-request-input=true",
            "--http-thread-count=4", "--grpc-infer-allocation-pool-size=4",
            "--trace-config=level=TIMESTAMPS", "--cache-config=local,size=1",
            "--allow-sagemaker=false", "--rate-limit=off", "--rate-limit-resource=R1:10",
            "--metrics-config=summary_latencies=true"]
    _, warnings = parse(argv, "tritonserver")
    assert len(warnings) == 2, warnings
    ignored, hardware = warnings
    assert "--http-thread-count (one event loop" in ignored
    assert "--grpc-infer-allocation-pool-size" in ignored
    for flag in ("--pinned-memory-pool-byte-size", "--cuda-memory-pool-byte-size",
                 "--min-supported-compute-capability", "--backend-directory",
                 "--backend-config=tensorrt"):
        assert flag in hardware
    assert "--metrics-config" not in " ".join(warnings)  # honoured
    assert "--trace-config" not in " ".join(warnings)
    assert "--cache-config" not in " ".join(warnings)
    assert "sagemaker" not in " ".join(warnings) and "--rate-limit" not in " ".join(warnings)


def test_python_backend_settings() -> None:
    config, warnings = parse([
        "--backend-config=python,shm-default-byte-size=4194304",
        "--backend-config=python,shm-region-prefix-name=rank0_",
        "--backend-config=python,shm-growth-byte-size=1048576",
        "--backend-config=python,no-such-setting=1",
        "--backend-config=default-max-batch-size=8"], "tritonserver")
    assert config.process_arena.ring_bytes == 4194304
    assert config.process_arena.name_prefix == "rank0_"
    assert config.features.backends.of("python")["default-max-batch-size"] == "8"
    assert len(warnings) == 1
    assert "shm-growth-byte-size (the arena" in warnings[0]
    assert "no-such-setting (not a python backend setting)" in warnings[0]
    assert "default-max-batch-size" not in warnings[0]


def test_structured_settings_of_features_not_built_yet() -> None:
    config, _ = parse([
        "--trace-level=TIMESTAMPS", "--trace-rate=50",
        "--trace-config", "rate=100", "--trace-config", "opentelemetry,url=localhost:4318",
        "--trace-config=mode=opentelemetry", "--trace-file=/tmp/t.json",
        "--cache-config=local,size=1048576", "--rate-limit=execution_count",
        "--rate-limit-resource=R1:10", "--rate-limit-resource=r2:4:0",
        "--allow-cpu-metrics=false", "--metrics-interval-ms=500",
        "--host-policy=gpu_0,cpu-cores=0-3"], "tritonserver")
    trace = config.features.trace
    assert trace.level == ("TIMESTAMPS",) and trace.rate == 100  # --trace-config wins
    assert trace.mode == "opentelemetry" and trace.enabled
    assert trace.settings("opentelemetry") == {"url": "localhost:4318"}
    assert trace.settings("triton") == {"file": "/tmp/t.json"}
    assert config.features.cache is not None
    assert config.features.cache.settings == (("size", "1048576"),)
    # Names keep their case, as tritonserver's (its lower-cased copy is never read).
    assert config.features.rate_limit.resources == (("R1", 10, -1), ("r2", 4, 0))
    assert config.features.rate_limit.mode == "execution_count"
    assert config.features.metrics.allow_cpu_metrics is False
    assert config.features.metrics.interval_ms == 500
    assert config.features.host_policies == (("gpu_0", "cpu-cores", "0-3"),)
    off, _ = parse(["--trace-level=TIMESTAMPS", "--trace-config=level=OFF"], "tritonserver")
    assert not off.features.trace.enabled  # an explicit OFF wins
    legacy, _ = parse(["--response-cache-byte-size=1024"], "tritonserver")
    assert legacy.features.cache is not None and legacy.features.cache.name == "local"


def test_log_settings_from_flags(tmp_path: Path) -> None:
    config, _ = parse(["--log-info=false", "--log-format=json",
                       f"--log-file={tmp_path / 'log'}"], "tritonserver")
    assert (config.log.info, config.log.warning, config.log.format) == (False, True, "json")
    assert config.log.file == str(tmp_path / "log")


def test_tritonserver_help_lists_the_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        tritonserver_main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: tritonserver")
    for flag in ("--strict-readiness", "--backend-config", "--model-store", "--trace-config"):
        assert flag in text


def test_table_flags_are_each_defined_once() -> None:
    names = [flag.name for flag in cli_flags.FLAGS]
    assert len(names) == len(set(names))
    assert isinstance(build_tritonserver_parser(), argparse.ArgumentParser)


def test_the_tritonserver_console_script_is_declared() -> None:
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    found = re.search(r'^tritonserver = "([\w.]+):(\w+)"$', pyproject, re.MULTILINE)
    assert found is not None
    module, function = found.groups()
    assert getattr(importlib.import_module(module), function) is tritonserver_main
