"""Model control on a real server: explicit load/unload/reload and poll mode, with requests
in flight."""

from __future__ import annotations

import base64
import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import tritonclient.grpc as grpcclient

from tests.e2e.observe import Records
from tests.server_process import TritiumProcess
from tests.zoo import MODELS_SOURCE, add_lifecycle_model, lifecycle_config

UNLOAD_TIMEOUT = 2.0  # --exit-timeout-secs: also how long an unload drains


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lifecycle") / "records.jsonl"


@pytest.fixture(scope="module")
def explicit(tmp_path_factory: pytest.TempPathFactory, record: Path) -> Iterator[TritiumProcess]:
    repo = tmp_path_factory.mktemp("explicit_repo")
    add_lifecycle_model(repo, "life", record, instances=2)
    for name in ("to_unload", "to_drop", "to_reload"):
        add_lifecycle_model(repo, name, record, instances=2)
    add_lifecycle_model(repo, "no_final", record, decoupled=True)
    process = TritiumProcess(repo, "--model-control-mode=explicit", "--load-model", "life",
                             "--exit-timeout-secs", str(UNLOAD_TIMEOUT)).start()
    yield process
    assert process.stop() == 0, process.log()


def url(server: TritiumProcess, path: str) -> str:
    return f"http://{server.http_url}{path}"


def index(server: TritiumProcess) -> dict[str, tuple[str, str]]:
    rows = requests.post(url(server, "/v2/repository/index"), timeout=10).json()
    return {f"{r['name']}/{r.get('version', '-')}": (r["state"], r["reason"]) for r in rows}


def wait_until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.05)


def infer(server: TritiumProcess, model: str, request_id: str, seconds: float
          ) -> requests.Response:
    body = {"id": request_id, "inputs": [
        {"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [seconds]}]}
    return requests.post(url(server, f"/v2/models/{model}/infer"), json=body, timeout=60)


def load(server: TritiumProcess, model: str, parameters: dict[str, Any] | None = None
         ) -> requests.Response:
    body = {"parameters": parameters} if parameters else None
    return requests.post(url(server, f"/v2/repository/models/{model}/load"), json=body,
                         timeout=60)


def unload(server: TritiumProcess, model: str) -> requests.Response:
    return requests.post(url(server, f"/v2/repository/models/{model}/unload"), timeout=60)


def in_background(call: Callable[[], Any]) -> Callable[[], Any]:
    """Start ``call`` on a thread; returns a function that joins it and gives its result."""
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(call()), daemon=True)
    thread.start()

    def result() -> Any:
        thread.join(60)
        return box[0]

    return result


# -- explicit mode ---------------------------------------------------------------------------
def test_explicit_mode_loads_only_the_named_models(explicit: TritiumProcess) -> None:
    rows = index(explicit)
    assert rows["life/1"] == ("READY", "")
    assert rows["to_unload/-"] == ("UNAVAILABLE", "unloaded")
    assert requests.get(url(explicit, "/v2/health/ready"), timeout=5).status_code == 200


def test_unload_lets_admitted_requests_finish_then_finalizes(
        explicit: TritiumProcess, record: Path) -> None:
    records = Records(record)
    assert load(explicit, "to_unload").status_code == 200
    pending = in_background(lambda: infer(explicit, "to_unload", "drained", 1.0))
    records.wait_for("drained", "start")

    assert unload(explicit, "to_unload").status_code == 200  # returns at once
    assert index(explicit)["to_unload/1"] == ("UNLOADING", "")
    refused = infer(explicit, "to_unload", "refused", 0.1)
    assert refused.status_code == 503
    reply = pending()
    assert reply.status_code == 200, reply.text
    assert reply.json()["outputs"][0]["data"] == [1.0, 1.0, 1.0]
    assert records.events("drained") == ["start", "done"]
    wait_until(lambda: index(explicit)["to_unload/1"] == ("UNAVAILABLE", "unloaded"))
    assert records.events("to_unload/1/1").count("finalize") == 2
    assert requests.get(url(explicit, "/v2/health/ready"), timeout=5).status_code == 200


def test_unload_cancels_what_outlives_the_deadline(
        explicit: TritiumProcess, record: Path) -> None:
    records = Records(record)
    assert load(explicit, "to_drop").status_code == 200
    pending = in_background(lambda: infer(explicit, "to_drop", "outlives", 60.0))
    records.wait_for("outlives", "start")
    started = time.monotonic()
    assert unload(explicit, "to_drop").status_code == 200
    reply = pending()
    assert UNLOAD_TIMEOUT - 0.5 < time.monotonic() - started < UNLOAD_TIMEOUT + 5
    assert reply.status_code == 503
    assert "model unloaded" in reply.json()["error"]
    records.wait_for("outlives", "cancelled")
    records.wait_for("to_drop/1/1", "finalize")


def test_unload_reports_a_stream_whose_model_never_sends_final(
        explicit: TritiumProcess, record: Path) -> None:
    assert load(explicit, "no_final").status_code == 200
    events: list[dict[str, Any]] = []

    def stream() -> None:
        with requests.post(url(explicit, "/v2/models/no_final/generate_stream"),
                           json={"id": "forever", "INPUT0": -1}, stream=True,
                           timeout=60) as reply:
            for line in reply.iter_lines():
                if line.startswith(b"data: "):
                    events.append(json.loads(line[len(b"data: "):]))

    done = in_background(stream)
    Records(record).wait_for("forever", "start")
    wait_until(lambda: len(events) == 1)
    mark = len(explicit.lines)
    assert unload(explicit, "no_final").status_code == 200
    done()
    assert "model unloaded" in events[-1]["error"]
    line = explicit.wait_for_line("request forever for model 'no_final'", start=mark)
    assert "did not finish" in line


def test_reload_with_a_config_override_serves_the_new_one_and_drops_nothing(
        explicit: TritiumProcess, record: Path) -> None:
    records = Records(record)
    assert load(explicit, "to_reload").status_code == 200
    old = in_background(lambda: infer(explicit, "to_reload", "old", 1.5))
    records.wait_for("old", "start")
    failures: list[str] = []
    stop = threading.Event()

    def hammer() -> None:
        count = 0
        while not stop.is_set():
            reply = infer(explicit, "to_reload", f"swap{count}", 0.0)
            count += 1
            if reply.status_code != 200:
                failures.append(reply.text)

    hammering = in_background(hammer)
    config = {"name": "to_reload", "backend": "python",
              "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [3]}],
              "parameters": {"record_file": {"string_value": str(record)},
                             "generation": {"string_value": "2"}}}
    assert load(explicit, "to_reload", {"config": json.dumps(config)}).status_code == 200
    new = infer(explicit, "to_reload", "new", 0.0)
    stop.set()
    hammering()
    assert failures == []
    assert new.json()["outputs"][0]["data"] == [0.0, 2.0, 1.0]
    assert old().json()["outputs"][0]["data"] == [1.5, 1.0, 1.0]  # finished on the old one
    records.wait_for("to_reload/1/1", "finalize")
    assert records.events("to_reload/1/2") == ["initialize"]


def test_load_with_file_overrides_over_grpc(explicit: TritiumProcess, record: Path) -> None:
    source = (MODELS_SOURCE / "lifecycle.py").read_bytes()
    config = {"backend": "python", "input": [{"name": "INPUT0", "data_type": "TYPE_FP32",
                                              "dims": [1]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [3]}],
              "parameters": {"record_file": {"string_value": str(record)},
                             "generation": {"string_value": "7"}}}
    with grpcclient.InferenceServerClient(explicit.grpc_url) as client:
        client.load_model("uploaded", config=json.dumps(config),
                          files={"file:3/model.py": source})
        assert client.is_model_ready("uploaded")
    assert infer(explicit, "uploaded", "up", 0.0).json()["outputs"][0]["data"] == [0, 7, 3]
    assert unload(explicit, "uploaded").status_code == 200
    Records(record).wait_for("uploaded/3/7", "finalize")


def test_http_file_overrides_are_base64(explicit: TritiumProcess, record: Path) -> None:
    config = lifecycle_config(record)  # text form is not accepted: the override is JSON
    reply = load(explicit, "b64", {"config": config,
                                   "file:1/model.py": base64.b64encode(b"x").decode()})
    assert reply.status_code == 400
    assert "Invalid config override" in reply.json()["error"]


# -- poll mode --------------------------------------------------------------------------------
def test_poll_mode_follows_added_changed_and_removed_models(tmp_path: Path) -> None:
    record = tmp_path / "records.jsonl"
    records = Records(record)
    repo = tmp_path / "repo"
    add_lifecycle_model(repo, "life", record)
    server = TritiumProcess(repo, "--model-control-mode=poll", "--repository-poll-secs=0.2",
                            "--exit-timeout-secs", "5").start()
    try:
        assert load(server, "life").status_code == 503  # the API is explicit mode's alone

        add_lifecycle_model(repo, "added", record)
        wait_until(lambda: index(server).get("added/1", ("", ""))[0] == "READY")
        assert infer(server, "added", "a1", 0.0).status_code == 200

        in_flight = in_background(lambda: infer(server, "life", "during_change", 1.5))
        records.wait_for("during_change", "start")
        (repo / "life" / "config.pbtxt").write_text(lifecycle_config(record, generation=2))
        wait_until(lambda: records.events("life/1/2") == ["initialize"])
        assert infer(server, "life", "after", 0.0).json()["outputs"][0]["data"] == [0, 2, 1]
        assert in_flight().json()["outputs"][0]["data"] == [1.5, 1.0, 1.0]
        records.wait_for("life/1/1", "finalize")

        (repo / "life" / "config.pbtxt").write_text("max_batch_size: -1\n")  # broken
        wait_until(lambda: "failed to reload" in server.log())
        assert infer(server, "life", "kept", 0.0).json()["outputs"][0]["data"] == [0, 2, 1]

        shutil.rmtree(repo / "added")
        wait_until(lambda: index(server).get("added/1") == ("UNAVAILABLE", "unloaded"))
        assert infer(server, "added", "a2", 0.0).status_code != 200
        records.wait_for("added/1/1", "finalize")
    finally:
        assert server.stop() == 0, server.log()
