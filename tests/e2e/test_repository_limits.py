"""Load requests on a real explicit-mode server: absurd counts in a config override are
refused at once, with the field named, while other clients go on being served; and a failed
load moves the server's readiness exactly where Triton's strict readiness moves it."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.server_process import TritiumProcess
from tests.zoo import MODELS_SOURCE, add_model

IO: dict[str, Any] = {
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]}
IDENTITY = (MODELS_SOURCE / "identity.py").read_bytes()
BAD_INIT = (MODELS_SOURCE / "bad_init.py").read_bytes()
REFUSAL_S = 5.0  # generous: the machine is shared; building the old queues took minutes
SERVED_S = 2.0  # the slowest answer an unrelated client may get meanwhile


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritiumProcess]:
    repo = tmp_path_factory.mktemp("limits_repo")
    config = 'backend: "python"\n' \
             'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [-1] }]\n' \
             'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [-1] }]\n'
    add_model(repo, "served", "identity", config)
    add_model(repo, "fails_init", "bad_init", config)
    add_model(repo, "absurd", "identity", config)  # in the repository, not loaded
    process = TritiumProcess(repo, "--model-control-mode=explicit", "--load-model", "served",
                             "--exit-timeout-secs", "2").start()
    yield process
    assert process.stop() == 0, process.log()


def url(server: TritiumProcess, path: str) -> str:
    return f"http://{server.http_url}{path}"


def load(server: TritiumProcess, name: str, parameters: dict[str, Any] | None = None
         ) -> requests.Response:
    body = {"parameters": parameters} if parameters else None
    return requests.post(url(server, f"/v2/repository/models/{name}/load"), json=body,
                         timeout=60)


def unload(server: TritiumProcess, name: str) -> None:
    reply = requests.post(url(server, f"/v2/repository/models/{name}/unload"), timeout=30)
    assert reply.status_code == 200, reply.text


def ready(server: TritiumProcess) -> int:
    return requests.get(url(server, "/v2/health/ready"), timeout=10).status_code


def config_override(**fields: Any) -> dict[str, Any]:
    return {"config": json.dumps({"backend": "python", **IO, **fields})}


def with_files(parameters: dict[str, Any], source: bytes) -> dict[str, Any]:
    return {**parameters, "file:1/model.py": base64.b64encode(source).decode()}


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class Bystander:
    """A client that keeps inferring on the ``served`` model and notes its slowest reply."""

    def __init__(self, server: TritiumProcess):
        self.server = server
        self.stop = threading.Event()
        self.slowest = 0.0
        self.statuses: set[int] = set()
        self.count = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Bystander:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)

    def _run(self) -> None:
        body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]}]}
        with requests.Session() as session:
            while not self.stop.is_set():
                started = time.monotonic()
                reply = session.post(url(self.server, "/v2/models/served/infer"), json=body,
                                     timeout=30)
                self.slowest = max(self.slowest, time.monotonic() - started)
                self.statuses.add(reply.status_code)
                self.count += 1


@pytest.mark.parametrize("name", ["absurd", "served"])  # a new model, and a reload
def test_absurd_counts_are_refused_fast_while_others_are_served(
        server: TritiumProcess, name: str) -> None:
    rss_before = rss_bytes(server.pid)
    absurd = [
        (config_override(dynamic_batching={"priority_levels": 100_000_000,
                                           "default_priority_level": 1}),
         "'dynamic_batching.priority_levels'"),
        (config_override(instance_group=[{"count": 100_000, "kind": "KIND_CPU"}]),
         "'instance_group' count"),
        (config_override(input=[{"name": "INPUT0", "data_type": "TYPE_FP32",
                                 "dims": [1] * 100_000}]), "'dims'"),
        (with_files(config_override(instance_group=[{"count": 2**31 - 1}]), IDENTITY),
         "'instance_group' count"),
    ]
    with Bystander(server) as bystander:
        for parameters, field in absurd:
            started = time.monotonic()
            reply = load(server, name, parameters)
            assert time.monotonic() - started < REFUSAL_S
            assert reply.status_code == 400, reply.text
            assert field in reply.json()["error"]
        while bystander.count < 5:  # it was served during, and is served after
            time.sleep(0.01)
    assert bystander.statuses == {200}
    assert bystander.slowest < SERVED_S
    assert rss_bytes(server.pid) - rss_before < 200 * 1024 * 1024
    assert ready(server) == 200
    assert requests.get(url(server, "/v2/models/served/ready"), timeout=10).status_code == 200


def test_absurd_counts_over_grpc_name_the_field(server: TritiumProcess) -> None:
    config = json.dumps({"backend": "python", **IO,
                         "instance_group": [{"count": 100_000, "kind": "KIND_CPU"}]})
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        with pytest.raises(InferenceServerException) as caught:
            client.load_model("absurd", config=config)
        assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "'instance_group' count" in str(caught.value.message())
        assert client.is_server_ready()


# -- readiness, as Triton's strict readiness --------------------------------------------------
def test_loads_refused_before_model_code_runs_leave_readiness_alone(
        server: TritiumProcess) -> None:
    refused = [
        ("no_such_model", None),  # Triton: failed to poll from the model repository
        ("..%2Fserved", None),  # not a model name at all
        ("named_wrong", config_override(name="other")),
        ("bad_json", {"config": "{not json"}),
        ("absurd", config_override(instance_group=[{"count": 100_000}])),
        ("absurd", with_files(config_override(name="other"), IDENTITY)),
    ]
    for name, parameters in refused:
        assert load(server, name, parameters).status_code == 400, name
        assert ready(server) == 200, name
    rows = requests.post(url(server, "/v2/repository/index"), timeout=10).json()
    assert not {row["name"] for row in rows} & {"no_such_model", "named_wrong", "bad_json"}
    absurd = next(row for row in rows if row["name"] == "absurd")
    assert (absurd["state"], absurd["reason"]) == ("UNAVAILABLE", "unloaded")  # unchanged


def test_a_model_whose_code_fails_makes_the_server_not_ready_until_it_is_dealt_with(
        server: TritiumProcess) -> None:
    # Triton keeps the failed version in its model states, so strict readiness is false.
    reply = load(server, "fails_init")
    assert reply.status_code == 400 and "initialize refuses" in reply.json()["error"]
    assert ready(server) == 400
    rows = requests.post(url(server, "/v2/repository/index"), timeout=10).json()
    row = next(r for r in rows if r["name"] == "fails_init")
    assert row["state"] == "UNAVAILABLE" and "initialize refuses" in row["reason"]
    unload(server, "fails_init")  # taken out of service on purpose: no longer counts
    assert ready(server) == 200

    assert load(server, "flaky", with_files(config_override(), BAD_INIT)).status_code == 400
    assert ready(server) == 400
    assert load(server, "flaky", with_files(config_override(), IDENTITY)).status_code == 200
    assert ready(server) == 200  # a successful load replaces the failure
    unload(server, "flaky")


def test_a_failed_reload_keeps_serving_and_the_server_ready(server: TritiumProcess) -> None:
    reply = load(server, "served", with_files(config_override(), BAD_INIT))
    assert reply.status_code == 400
    assert ready(server) == 200
    assert requests.get(url(server, "/v2/models/served/ready"), timeout=10).status_code == 200
