"""The log line formats: Triton's default and ISO8601, and one JSON object per record."""

from __future__ import annotations

import json
import logging
import re

from tritium.core.log_format import ServerFormatter


def _record(**extra: object) -> logging.LogRecord:
    record = logging.LogRecord("tritium.scheduling", logging.INFO, __file__, 1,
                               "request %s cancelled", ("r1",), None)
    record.__dict__.update(extra)
    return record


def test_json_carries_the_fields_and_the_extras_a_call_passes() -> None:
    line = ServerFormatter("json").format(_record(
        request_id="r1", model="m", version=2, cancel_reason="client disconnected",
        cancel_stage="queued"))
    fields = json.loads(line)
    assert fields["level"] == "INFO" and fields["logger"] == "tritium.scheduling"
    assert fields["message"] == "request r1 cancelled"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", fields["time"])
    assert (fields["request_id"], fields["model"], fields["version"]) == ("r1", "m", 2)
    assert (fields["cancel_reason"], fields["cancel_stage"]) == ("client disconnected",
                                                                 "queued")
    assert "request_id" not in json.loads(ServerFormatter("json").format(_record()))


def test_the_mode_switches_between_the_line_formats() -> None:
    formatter = ServerFormatter()
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO tritium.scheduling: request",
                    formatter.format(_record()))
    formatter.mode = "ISO8601"
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4} INFO ", formatter.format(_record()))
    formatter.mode = "json"
    assert json.loads(formatter.format(_record()))["level"] == "INFO"
