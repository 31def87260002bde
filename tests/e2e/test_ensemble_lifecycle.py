"""Ensembles' lifecycle on a real server, over HTTP and gRPC: each load-time validation
error (explicit load and startup), explicit load/unload with ``unload_dependents``, the
repository index, readiness following the composing models, and polling.

Triton's behaviour matched (core, model_repository_manager.cc; server, L0_lifecycle's
test_model_control and test_model_control_ensemble): loading an ensemble in explicit mode
polls and loads its composing models too; unloading a composing model takes its ensemble
out, and the ensemble comes back when the model is loaded again unless the ensemble was
unloaded on purpose; ``unload_dependents`` also unloads the composing models that were not
loaded on their own; a composing model that changes makes its ensemble be checked again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.ensemble_repos import (
    BAD,
    add_ensemble,
    add_identity,
    add_pipeline,
    build_validation_repository,
    chain,
    ensemble_config,
    identity_config,
)
from tests.server_process import TritiumProcess
from tests.zoo import _tensor, add_model

PROTOCOLS = ("http", "grpc")
Client = Any  # tritonclient.http or tritonclient.grpc InferenceServerClient


def client(server: TritiumProcess, protocol: str) -> Client:
    if protocol == "http":
        return httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    return grpcclient.InferenceServerClient(server.grpc_url)


def index(server: TritiumProcess) -> dict[str, tuple[str, str]]:
    rows = requests.post(f"http://{server.http_url}/v2/repository/index", timeout=10).json()
    return {r["name"]: (r.get("state", ""), r.get("reason", "")) for r in rows}


def client_index(c: Client, protocol: str) -> dict[str, tuple[str, str]]:
    """The repository index as the protocol's own client reads it."""
    if protocol == "http":
        rows = c.get_model_repository_index()
    else:
        rows = c.get_model_repository_index(as_json=True).get("models", [])
    return {r["name"]: (r.get("state", ""), r.get("reason", "")) for r in rows}


def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.05)


def wait_state(server: TritiumProcess, name: str, state: str) -> None:
    wait_until(lambda: index(server).get(name, ("", ""))[0] == state)


def infer_identity(c: Client, protocol: str, model: str) -> list[float]:
    module = httpclient if protocol == "http" else grpcclient
    data = np.array([1.5, 2.5], dtype=np.float32)
    tensor = module.InferInput("IN", [2], "FP32")
    tensor.set_data_from_numpy(data)
    result = c.infer(model, [tensor])
    return list(result.as_numpy("OUT"))


@pytest.fixture(scope="module")
def validation_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_validation_repository(tmp_path_factory.mktemp("ensemble_validation"))


@pytest.fixture(scope="module")
def explicit_validation(validation_repo: Path) -> Iterator[TritiumProcess]:
    server = TritiumProcess(validation_repo, "--model-control-mode=explicit").start()
    yield server
    assert server.stop() == 0, server.log()


# -- validation errors ---------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("name", sorted(BAD))
def test_each_validation_error_refuses_an_explicit_load(
        explicit_validation: TritiumProcess, protocol: str, name: str) -> None:
    """Each ensemble error answers the load with Triton's text (INVALID_ARG: HTTP 400),
    and the ensemble stays unavailable with that reason in the index."""
    with pytest.raises(InferenceServerException) as info:
        client(explicit_validation, protocol).load_model(name)
    assert BAD[name] in str(info.value.message())
    state, reason = index(explicit_validation)[name]
    assert state == "UNAVAILABLE"
    if "(in " not in str(info.value.message()):  # refused after its config was read
        assert BAD[name] in reason
    assert not client(explicit_validation, protocol).is_model_ready(name)


def test_each_validation_error_at_startup(validation_repo: Path) -> None:
    """Without model control every model loads at startup, composing models first: each
    bad ensemble is UNAVAILABLE with its reason, the good one serves, the server is not
    ready (a model that should serve did not)."""
    server = TritiumProcess(validation_repo).start()
    try:
        rows = index(server)
        for name, text in BAD.items():
            state, reason = rows[name]
            assert state == "UNAVAILABLE", (name, rows[name])
            assert text in reason, (name, reason)
        assert rows["good"] == ("READY", "")
        for protocol in PROTOCOLS:
            assert infer_identity(client(server, protocol), protocol, "good") == [1.5, 2.5]
        ready = requests.get(f"http://{server.http_url}/v2/health/ready", timeout=10)
        assert ready.status_code == 400
    finally:
        assert server.stop() == 0, server.log()


def test_a_decoupled_composing_model_makes_the_ensemble_decoupled(
        explicit_validation: TritiumProcess) -> None:
    """Triton sets model_transaction_policy.decoupled on an ensemble with a decoupled step;
    /config shows it."""
    c = client(explicit_validation, "http")
    c.load_model("good")
    assert c.get_model_config("good")["model_transaction_policy"] == {"decoupled": False}
    repo = explicit_validation.repository
    add_ensemble(repo, "streaming", ensemble_config(
        [("repeat", {"INPUT0": "IN"}, {"OUTPUT0": "tok"}), ("ints", {"INPUT0": "tok"},
                                                           {"OUTPUT0": "OUT"})],
        inputs="IN:INT32:1", outputs="OUT:INT32:-1"))
    c.load_model("streaming")
    assert c.get_model_config("streaming")["model_transaction_policy"] == {"decoupled": True}


# -- explicit load / unload -------------------------------------------------------------------
@pytest.fixture(scope="module")
def explicit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritiumProcess]:
    repo = tmp_path_factory.mktemp("ensemble_explicit")
    for protocol in PROTOCOLS:
        add_pipeline(repo, f"pipe_{protocol}", f"first_{protocol}", f"second_{protocol}")
    server = TritiumProcess(repo, "--model-control-mode=explicit",
                            "--exit-timeout-secs", "5").start()
    yield server
    assert server.stop() == 0, server.log()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_loading_an_ensemble_loads_its_composing_models(
        explicit: TritiumProcess, protocol: str) -> None:
    c = client(explicit, protocol)
    pipe, first, second = f"pipe_{protocol}", f"first_{protocol}", f"second_{protocol}"
    assert not any(c.is_model_ready(m) for m in (pipe, first, second))
    c.load_model(pipe)
    rows = client_index(c, protocol)
    assert [rows[m] for m in (pipe, first, second)] == [("READY", "")] * 3
    assert infer_identity(c, protocol, pipe) == [1.5, 2.5]

    # unload_dependents: the composing models loaded only for it go with it.
    c.unload_model(pipe, unload_dependents=True)
    for model in (pipe, first, second):
        assert not c.is_model_ready(model)
        wait_state(explicit, model, "UNAVAILABLE")
        assert client_index(c, protocol)[model] == ("UNAVAILABLE", "unloaded")

    # Without it they stay.
    c.load_model(pipe)
    c.unload_model(pipe)
    wait_state(explicit, pipe, "UNAVAILABLE")
    assert c.is_model_ready(first) and c.is_model_ready(second)

    # A composing model loaded on its own request stays even with unload_dependents.
    c.load_model(first)
    c.load_model(pipe)
    c.unload_model(pipe, unload_dependents=True)
    wait_state(explicit, second, "UNAVAILABLE")
    assert c.is_model_ready(first)
    assert not c.is_model_ready(pipe)
    assert c.is_server_ready()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_ensemble_is_ready_while_its_composing_models_are(
        explicit: TritiumProcess, protocol: str) -> None:
    """Unloading a composing model takes the ensemble out (the server stays ready: nothing
    failed); loading the model again brings it back; an ensemble unloaded on purpose is
    not brought back."""
    c = client(explicit, protocol)
    pipe, second = f"pipe_{protocol}", f"second_{protocol}"
    c.load_model(pipe)
    assert c.is_model_ready(pipe)
    c.unload_model(second)
    assert not c.is_model_ready(pipe)
    wait_state(explicit, pipe, "UNAVAILABLE")
    assert index(explicit)[pipe] == ("UNAVAILABLE", "unloaded")
    assert c.is_server_ready()
    with pytest.raises(InferenceServerException):
        infer_identity(c, protocol, pipe)

    c.load_model(second)
    assert c.is_model_ready(pipe)
    assert infer_identity(c, protocol, pipe) == [1.5, 2.5]

    c.unload_model(pipe)
    c.unload_model(second)
    c.load_model(second)
    assert not c.is_model_ready(pipe)
    assert c.is_model_ready(second)


def test_bls_unload_model_with_unload_dependents(tmp_path: Path) -> None:
    """pb_utils.unload_model(name, unload_dependents=True) from a model unloads the
    ensemble's composing models too (Triton's python backend passes the flag through)."""
    repo = tmp_path / "repo"
    add_pipeline(repo, "pipe", "first", "second")
    add_model(repo, "model_control", "model_control",
              _tensor("input", "ACTION", "BYTES", "1") + _tensor("input", "NAME", "BYTES", "1")
              + _tensor("input", "VERSION", "BYTES", "1")
              + _tensor("output", "OUTPUT0", "BOOL", "1"))
    server = TritiumProcess(repo, "--model-control-mode=explicit",
                            "--load-model", "model_control", "--load-model", "pipe").start()
    try:
        c = client(server, "http")
        # --load-model of an ensemble loads its composing models at startup too.
        assert all(c.is_model_ready(m) for m in ("pipe", "first", "second"))
        c.load_model("first")  # loaded on its own: unload_dependents leaves it
        inputs = []
        for name, value in (("ACTION", "unload_dependents"), ("NAME", "pipe"), ("VERSION", "")):
            tensor = httpclient.InferInput(name, [1], "BYTES")
            tensor.set_data_from_numpy(np.array([value.encode()], dtype=np.object_))
            inputs.append(tensor)
        c.infer("model_control", inputs)
        wait_state(server, "second", "UNAVAILABLE")
        assert c.is_model_ready("first") and not c.is_model_ready("pipe")
    finally:
        assert server.stop() == 0, server.log()


# -- polling --------------------------------------------------------------------------------------
def test_polling_rechecks_an_ensemble_when_a_composing_config_changes(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    add_pipeline(repo, "pipe", "first", "second")
    server = TritiumProcess(repo, "--model-control-mode=poll", "--repository-poll-secs=0.2",
                            "--exit-timeout-secs", "5").start()
    try:
        c = client(server, "grpc")
        assert infer_identity(c, "grpc", "pipe") == [1.5, 2.5]
        config = repo / "second" / "config.pbtxt"

        # An incompatible change: the ensemble no longer holds together and goes out.
        config.write_text(identity_config("INT32"))
        wait_until(lambda: "inconsistent data type" in server.log())
        wait_state(server, "pipe", "UNAVAILABLE")
        assert index(server)["second"] == ("READY", "")
        assert not c.is_model_ready("pipe")

        # Compatible again (a changed file, so a reload): the ensemble is back.
        config.write_text(identity_config(extra="# changed\n"))
        wait_state(server, "pipe", "READY")
        assert infer_identity(c, "grpc", "pipe") == [1.5, 2.5]

        # A composing model removed from the repository takes the ensemble with it...
        held = tmp_path / "held"
        (repo / "first").rename(held)
        wait_state(server, "pipe", "UNAVAILABLE")
        # ...and it returns with the model.
        held.rename(repo / "first")
        wait_state(server, "pipe", "READY")
        assert infer_identity(c, "grpc", "pipe") == [1.5, 2.5]
    finally:
        assert server.stop() == 0, server.log()


def test_an_ensemble_added_by_polling_loads_after_its_composing_model(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    add_identity(repo, "first")
    server = TritiumProcess(repo, "--model-control-mode=poll", "--repository-poll-secs=0.2",
                            "--exit-timeout-secs", "5").start()
    try:
        add_identity(repo, "zeta")
        add_ensemble(repo, "alpha", ensemble_config(chain("first", "zeta")))
        wait_state(server, "alpha", "READY")
        assert index(server)["zeta"] == ("READY", "")
        assert infer_identity(client(server, "http"), "http", "alpha") == [1.5, 2.5]
    finally:
        assert server.stop() == 0, server.log()
