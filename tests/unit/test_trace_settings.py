"""Trace settings: ``--trace-config`` as Triton reads it, and the settings clients change at
run time (global and per model) with the sampling that follows them."""

from __future__ import annotations

from typing import Any

import pytest

from tritium.core.errors import ErrorCode, TritiumError
from tritium.tracing.control import TraceControl
from tritium.tracing.settings import TraceSettings


def flags(*pairs: str) -> TraceSettings:
    return TraceSettings.from_flags(pairs)


def test_trace_config_reads_triton_keys() -> None:
    settings = flags("triton,file=/tmp/t.json", "triton,log-frequency=50", "rate=100",
                     "level=TIMESTAMPS", "level=TENSORS", "count=100")
    assert (settings.file, settings.log_frequency, settings.rate, settings.count) == (
        "/tmp/t.json", 50, 100, 100)
    assert settings.level == ("TIMESTAMPS", "TENSORS") and settings.mode == "triton"
    otel = flags("mode=opentelemetry", "opentelemetry,url=http://c:4318/v1/traces",
                 "opentelemetry,resource=service.name=a", "opentelemetry,resource=x=1=2",
                 "opentelemetry,bsp_max_queue_size=10", "opentelemetry,bsp_schedule_delay=5",
                 "opentelemetry,bsp_max_export_batch_size=2")
    assert otel.resource == (("service.name", "a"), ("x", "1=2"))
    assert (otel.bsp_max_queue_size, otel.bsp_schedule_delay,
            otel.bsp_max_export_batch_size) == (10, 5, 2)
    assert flags("level=TIMESTAMPS", "level=OFF").level == ("OFF",)
    assert not flags().tracing


@pytest.mark.parametrize("pair", [
    "rate", "speed=3", "triton,url=x", "opentelemetry,file=x", "jaeger,url=x", "rate=-1",
    "count=-2", "level=LOUD", "mode=zipkin", "opentelemetry,bsp_max_queue_size=0",
    "opentelemetry,resource=novalue",
])
def test_trace_config_refuses(pair: str) -> None:
    with pytest.raises(ValueError):
        flags(pair)


def code_of(control: TraceControl, changes: dict[str, Any], model: str | None = None
            ) -> ErrorCode:
    with pytest.raises(TritiumError) as caught:
        control.update(changes, model)
    return caught.value.code


def test_runtime_changes_are_checked_whole() -> None:
    control = TraceControl(flags("triton,file=/tmp/t.json"))
    before = control.current(None)
    for changes, code in (({"trace_level": ["OFF", "TIMESTAMPS"]}, ErrorCode.INVALID_ARG),
                          ({"trace_level": "TIMESTAMPS"}, ErrorCode.INVALID_ARG),
                          ({"trace_rate": "1", "trace_count": "-2"}, ErrorCode.INVALID_ARG),
                          ({"trace_rate": 5}, ErrorCode.INVALID_ARG),
                          ({"trace_file": "/x"}, ErrorCode.UNSUPPORTED),
                          ({"trace_mode": "opentelemetry"}, ErrorCode.UNSUPPORTED),
                          ({"trace_level": ["TIMESTAMPS"], "trace_rate": "0"},
                           ErrorCode.INVALID_ARG),
                          ({"no_such": "1"}, ErrorCode.INVALID_ARG)):
        assert code_of(control, changes) is code, changes
    assert control.current(None) == before
    assert not control.any_tracing


def test_model_settings_fall_back_on_global_ones() -> None:
    control = TraceControl(flags("triton,file=/tmp/t.json"))
    control.update({"trace_rate": "3"}, "m")
    control.update({"trace_level": ["TIMESTAMPS"]}, None)
    model = control.current("m")
    assert (model["trace_level"], model["trace_rate"]) == (["TIMESTAMPS"], "3")
    assert control.current("other")["trace_rate"] == "1000"
    # Every 3rd request to "m" is traced.
    sampler = control.sampler("m")
    assert [sampler.sample(False) for _ in range(6)] == [False, False, True] * 2
    control.update({"trace_rate": None}, "m")  # back to the global value
    assert control.current("m")["trace_rate"] == "1000"
    control.update({"trace_level": None}, None)  # back to the startup value
    assert control.current("m")["trace_level"] == ["OFF"] and not control.any_tracing


def test_count_limits_traces_and_a_context_forces_one() -> None:
    control = TraceControl(flags("mode=opentelemetry", "level=TIMESTAMPS", "rate=1",
                                 "count=2"))
    sampler = control.sampler("m")
    assert [sampler.sample(False) for _ in range(4)] == [True, True, False, False]
    assert control.current(None)["trace_count"] == "0"
    assert sampler.sample(True)  # a request that carries a trace context is traced
    propagated_only = TraceControl(flags("mode=opentelemetry", "level=TIMESTAMPS", "rate=0"))
    assert not propagated_only.sampler("m").sample(False)
    assert propagated_only.sampler("m").sample(True)


def test_read_back_shows_the_modes_settings() -> None:
    triton = TraceControl(flags("triton,file=/tmp/t.json", "level=TIMESTAMPS"))
    assert triton.current(None) == {
        "trace_level": ["TIMESTAMPS"], "trace_rate": "1000", "trace_count": "-1",
        "log_frequency": "0", "trace_file": "/tmp/t.json", "trace_mode": "triton"}
    otel = TraceControl(flags("mode=opentelemetry", "opentelemetry,url=http://c/v1/traces"))
    assert otel.current(None) == {
        "trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1",
        "trace_mode": "opentelemetry", "url": "http://c/v1/traces"}


def test_trace_file_log_frequency_writes_indexed_files(tmp_path: Any) -> None:
    import json

    from tritium.tracing.file import TraceFile

    path = tmp_path / "trace.json"
    every_two = TraceFile(str(path), 2)
    for index in range(3):
        every_two.write(json.dumps({"id": index}).encode())
    assert json.loads((tmp_path / "trace.json.0").read_text()) == [{"id": 0}, {"id": 1}]
    assert not (tmp_path / "trace.json.1").exists()
    every_two.close()  # what is left goes to the next index
    assert json.loads((tmp_path / "trace.json.1").read_text()) == [{"id": 2}]
    single = TraceFile(str(path), 0)
    single.write(b'{"id":1}')
    single.write(b'{"id":2}')
    single.close()
    assert json.loads(path.read_text()) == [{"id": 1}, {"id": 2}]


def test_cli_takes_trace_config() -> None:
    from tritium.cli import parse_config

    config = parse_config(["serve", "--trace-config", "mode=opentelemetry",
                           "--trace-config", "level=TIMESTAMPS"])
    assert config.trace.mode == "opentelemetry" and config.trace.tracing
    with pytest.raises(SystemExit):
        parse_config(["serve", "--trace-config", "speed=3"])


def test_opentelemetry_resource_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from tritium.tracing.otel import provider_for

    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test,team=ml")
    provider = provider_for(flags("mode=opentelemetry", "opentelemetry,resource=team=infra",
                                  "opentelemetry,url=http://127.0.0.1:9/v1/traces"))
    try:
        attributes = provider.resource.attributes
        # Triton's default service name; the variable's attributes; the flag wins over it.
        assert attributes["service.name"] == "triton-inference-server"
        assert attributes["deployment.environment"] == "test"
        assert attributes["team"] == "infra"
    finally:
        provider.shutdown()
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    provider = provider_for(flags("mode=opentelemetry"))
    try:
        assert provider.resource.attributes["service.name"] == "from-env"
    finally:
        provider.shutdown()
