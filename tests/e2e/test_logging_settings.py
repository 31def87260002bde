"""The logging extension (and trace settings) over HTTP and gRPC, on a server of its own:
these tests change how that server logs."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.e2e.test_protocols import Client
from tests.server_process import TritiumProcess
from tests.zoo import add_model

IDENTITY = ('backend: "python"\nmax_batch_size: 0\n'
            'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [-1] }]\n'
            'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [-1] }]\n')
LOG_DEFAULTS = {"log_file": "", "log_info": True, "log_warning": True, "log_error": True,
                "log_verbose_level": 0, "log_format": "default"}
TRACE_DEFAULTS = {"trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1",
                  "log_frequency": "0", "trace_file": "", "trace_mode": "triton"}


class ServerClient(Client):
    """A client that knows its server, whose log the tests read."""

    def __init__(self, protocol: str, server: TritiumProcess):
        super().__init__(protocol, server)
        self.server = server


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServerClient]:
    for name in ("alpha", "beta"):
        add_model(tmp_path, name, "identity", IDENTITY)
    server = TritiumProcess(tmp_path, "--model-control-mode=explicit").start()
    wrapped = ServerClient(request.param, server)
    try:
        yield wrapped
    finally:
        wrapped.raw.close()
        assert server.stop() == 0, server.log()


def log_settings(client: Client, changes: dict[str, Any] | None = None) -> dict[str, Any]:
    """The settings as HTTP writes them, whichever protocol asked."""
    raw = client.raw
    if client.protocol == "http":
        return raw.get_log_settings() if changes is None else raw.update_log_settings(changes)
    reply = raw.get_log_settings(as_json=True) if changes is None else \
        raw.update_log_settings(changes, as_json=True)
    # {"log_info": {"bool_param": true}, ...}: one oneof field per setting.
    return {key: next(iter(value.values())) for key, value in reply["settings"].items()}


def trace_settings(client: Client, changes: dict[str, Any] | None = None) -> dict[str, Any]:
    raw = client.raw
    if client.protocol == "http":
        return raw.get_trace_settings() if changes is None else \
            raw.update_trace_settings(settings=changes)
    reply = raw.get_trace_settings(as_json=True) if changes is None else \
        raw.update_trace_settings(settings=changes, as_json=True)
    return {key: value["value"] if key == "trace_level" else value["value"][0]
            for key, value in reply["settings"].items()}


def ready_lines(server: TritiumProcess, model: str) -> list[str]:
    return [line for line in server.lines if f"model '{model}' version 1 is READY" in line]


def test_log_settings_are_read_changed_and_applied(client: ServerClient) -> None:
    server = client.server
    assert log_settings(client) == LOG_DEFAULTS
    assert "logging" in client.json("get_server_metadata")["extensions"]
    client.raw.load_model("alpha")
    server.wait_for_line("model 'alpha' version 1 is READY")
    assert not [line for line in server.lines if " DEBUG " in line]

    changed = {**LOG_DEFAULTS, "log_info": False, "log_verbose_level": 1}
    assert log_settings(client, {"log_info": False, "log_verbose_level": 1}) == changed
    assert log_settings(client) == changed
    client.raw.load_model("alpha")  # a reload: its READY line is INFO, now hidden
    requests.get(server.metrics_url + "?probe=verbose", timeout=10)  # logged at DEBUG
    assert " DEBUG " in server.wait_for_line("probe=verbose")

    assert log_settings(client, {"log_info": True})["log_info"] is True
    client.raw.load_model("beta")
    server.wait_for_line("model 'beta' version 1 is READY")
    # The log is one ordered stream, and alpha's reload answered before beta was asked for.
    assert len(ready_lines(server, "alpha")) == 1, server.log()


def test_log_settings_refuse_bad_changes(client: Client) -> None:
    for changes in ({"no_such_setting": True}, {"log_format": "fancy"}):
        error = client.failure(partial(log_settings, client, changes))
        assert error.status() == client.status("INVALID_ARG")
        assert next(iter(changes)) in (error.message() or "")
    error = client.failure(lambda: log_settings(client, {"log_file": "/tmp/tritium.log"}))
    assert error.status() == client.status("UNSUPPORTED")
    assert "log_file" in (error.message() or "")
    assert log_settings(client) == LOG_DEFAULTS


def test_trace_settings_without_a_trace_file(client: Client) -> None:
    assert trace_settings(client) == TRACE_DEFAULTS
    assert trace_settings(client, {"trace_level": ["OFF"]}) == TRACE_DEFAULTS
    # Triton's trace mode needs a file, which only the command line gives.
    error = client.failure(partial(trace_settings, client, {"trace_level": ["TIMESTAMPS"]}))
    assert error.status() == client.status("INVALID_ARG")
    assert "trace file name is not given" in (error.message() or "")
    error = client.failure(partial(trace_settings, client, {"trace_file": "/tmp/trace.json"}))
    assert error.status() == client.status("UNSUPPORTED")
    error = client.failure(lambda: trace_settings(client, {"trace_rate": "often"}))
    assert error.status() == client.status("INVALID_ARG")
    assert trace_settings(client) == TRACE_DEFAULTS
    assert "trace" in client.json("get_server_metadata")["extensions"]
