"""Log and trace settings: validation, and their effect on Python logging (no server)."""

from __future__ import annotations

import io
import itertools
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from tritonclient.grpc import service_pb2 as pb

from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.logging_settings import LogSettings
from tritium.core.tracing import NoTracer
from tritium.frontends.grpc import codec

DEFAULTS = {"log_file": "", "log_info": True, "log_warning": True, "log_error": True,
            "log_verbose_level": 0, "log_format": "default"}
_names = itertools.count()


@dataclass
class Logs:
    settings: LogSettings
    server: logging.Logger  # what the settings govern
    model: logging.Logger  # a child of it, as tritium.model is of tritium
    other: logging.Logger  # not the server's, but writing to the same handler
    output: io.StringIO

    def lines(self) -> list[str]:
        return self.output.getvalue().splitlines()


@pytest.fixture
def logs() -> Iterator[Logs]:
    # A private tree, so the test leaves the process's logging alone.
    top = logging.getLogger(f"settings_test_{next(_names)}")
    top.propagate = False
    output = io.StringIO()
    handler = logging.StreamHandler(output)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    top.addHandler(handler)
    top.setLevel(logging.DEBUG)
    server = top.getChild("server")
    yield Logs(LogSettings(server), server, server.getChild("model"), top.getChild("other"),
               output)
    top.removeHandler(handler)


def every_level(logger: logging.Logger) -> None:
    for level in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR,
                  logging.CRITICAL):
        logger.log(level, "%s", logging.getLevelName(level).lower())


def messages(logs: Logs) -> list[str]:
    return [line.rsplit(": ", 1)[1] for line in logs.lines()]


def code_of(call: Any, *args: Any) -> ErrorCode:
    with pytest.raises(TritiumError) as caught:
        call(*args)
    return caught.value.code


# ------------------------------------------------------------------------------- log


def test_defaults_and_building_applies_nothing(logs: Logs) -> None:
    assert logs.settings.current() == DEFAULTS
    assert logs.server.level == logging.NOTSET
    assert logs.settings.update({}) == DEFAULTS
    assert logs.server.level == logging.NOTSET


def test_defaults_show_info_and_above_but_not_debug(logs: Logs) -> None:
    logs.settings.apply()
    every_level(logs.model)
    assert messages(logs) == ["info", "warning", "error", "critical"]


def test_verbose_level_shows_debug(logs: Logs) -> None:
    updated = logs.settings.update({"log_verbose_level": 2})
    assert updated == {**DEFAULTS, "log_verbose_level": 2}
    every_level(logs.model)
    assert messages(logs) == ["debug", "info", "warning", "error", "critical"]
    logs.settings.update({"log_verbose_level": 0})
    logs.model.debug("hidden again")
    assert "hidden again" not in logs.output.getvalue()


@pytest.mark.parametrize(("setting", "hidden"), [
    ("log_info", ["info"]),
    ("log_warning", ["warning"]),
    ("log_error", ["error", "critical"]),
])
def test_switching_a_level_off_hides_only_the_servers_records(
        logs: Logs, setting: str, hidden: list[str]) -> None:
    assert logs.settings.update({setting: False})[setting] is False
    every_level(logs.model)
    every_level(logs.other)
    shown = [m for m in ["info", "warning", "error", "critical"] if m not in hidden]
    assert messages(logs) == [*shown, "debug", "info", "warning", "error", "critical"]
    logs.settings.update({setting: True})
    every_level(logs.server)
    assert messages(logs)[-4:] == ["info", "warning", "error", "critical"]


def test_iso8601_format_switches_the_date_and_back(logs: Logs) -> None:
    logs.settings.update({"log_format": "ISO8601"})
    logs.server.info("iso")
    logs.settings.update({"log_format": "default"})
    logs.server.info("plain")
    iso, plain = logs.lines()
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4} INFO ", iso), iso
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO ", plain), plain


@pytest.mark.parametrize("changes", [
    {"no_such_setting": True},
    {"log_info": 1},
    {"log_info": "false"},
    {"log_verbose_level": True},
    {"log_verbose_level": -1},
    {"log_verbose_level": 2**32},
    {"log_verbose_level": "1"},
    {"log_format": "iso8601"},
    {"log_format": 1},
])
def test_invalid_changes_are_refused_whole(logs: Logs, changes: dict[str, Any]) -> None:
    with pytest.raises(TritiumError) as caught:
        logs.settings.update({"log_info": False, **changes})
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert next(iter(changes)) in caught.value.message
    assert logs.settings.current() == DEFAULTS
    assert logs.server.level == logging.NOTSET


def test_log_file_cannot_be_changed(logs: Logs) -> None:
    assert code_of(logs.settings.update, {"log_file": "/tmp/x.log"}) is ErrorCode.UNSUPPORTED
    assert code_of(logs.settings.update, {"log_file": ""}) is ErrorCode.UNSUPPORTED
    # null leaves a setting as it is, log_file included.
    assert logs.settings.update({"log_file": None, "log_info": None}) == DEFAULTS


# ----------------------------------------------------------------------------- trace


def test_a_service_without_a_tracer_answers_the_defaults_and_refuses_changes() -> None:
    tracer = NoTracer()
    assert tracer.settings(None) == {"trace_level": ["OFF"], "trace_rate": "1000",
                                     "trace_count": "-1", "log_frequency": "0",
                                     "trace_file": "", "trace_mode": "triton"}
    assert code_of(tracer.update, {"trace_rate": "5"}, None) is ErrorCode.UNSUPPORTED


# -------------------------------------------------------------- gRPC map <-> plain dict


def test_grpc_log_settings_map_to_plain_values_and_back() -> None:
    request = pb.LogSettingsRequest()
    request.settings["log_info"].bool_param = False
    request.settings["log_verbose_level"].uint32_param = 3
    request.settings["log_format"].string_param = "ISO8601"
    request.settings["no_such_setting"].bool_param = True  # the core names it unknown
    request.settings["log_file"].SetInParent()  # a key without a value
    assert codec.decode_log_settings(request) == {
        "log_info": False, "log_verbose_level": 3, "log_format": "ISO8601",
        "no_such_setting": True, "log_file": None}
    encoded = codec.encode_log_settings(DEFAULTS)  # type: ignore[arg-type]
    assert encoded.settings["log_verbose_level"].uint32_param == 0
    assert encoded.settings["log_verbose_level"].WhichOneof("parameter_choice") == "uint32_param"
    assert encoded.settings["log_error"].WhichOneof("parameter_choice") == "bool_param"
    assert encoded.settings["log_file"].WhichOneof("parameter_choice") == "string_param"


def test_grpc_trace_settings_map_to_plain_values_and_back() -> None:
    request = pb.TraceSettingRequest()
    request.settings["trace_level"].value.extend(["OFF"])
    request.settings["trace_rate"].value.extend(["1000"])
    request.settings["trace_file"].SetInParent()  # empty: reset to the global value
    assert codec.decode_trace_settings(request) == {
        "trace_level": ["OFF"], "trace_rate": "1000", "trace_file": None}
    request.settings["trace_count"].value.extend(["1", "2"])
    with pytest.raises(TritiumError):
        codec.decode_trace_settings(request)
    encoded = codec.encode_trace_settings(NoTracer().settings(None))
    assert list(encoded.settings["trace_level"].value) == ["OFF"]
    assert list(encoded.settings["trace_rate"].value) == ["1000"]
