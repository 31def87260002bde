"""BLS and the model loading API as Triton's python backend runs them: concurrent async
decoupled BLS, cancelling a decoupled child, pb_utils.load_model / unload_model /
is_model_ready, and BLS refused outside execute()."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import instance_kinds
from tests.server_process import TritiumProcess
from tests.zoo import add_model

DECOUPLED = "model_transaction_policy { decoupled: true }\n"
PROTOCOLS = ("http", "grpc")


def tensors(kind: str, *specs: str) -> str:
    """Config entries from 'NAME TYPE dims' specs, e.g. 'INPUT0 FP32 1'."""
    entries = []
    for spec in specs:
        name, datatype, dims = spec.split(" ", 2)
        config_type = "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"
        entries.append(f'{{ name: "{name}" data_type: {config_type} dims: [{dims}] }}')
    return f"{kind} [{', '.join(entries)}]\n"


def build(repo: Path) -> Path:
    add_model(repo, "async_decoupled", "async_decoupled",
              DECOUPLED + tensors("input", "INPUT0 FP32 1") + tensors("output", "OUTPUT0 FP64 2"))
    add_model(repo, "repeat", "repeat",
              DECOUPLED + tensors("input", "INPUT0 INT32 1", "DELAY FP32 1")
              + tensors("output", "OUTPUT0 INT32 1"))
    add_model(repo, "bls_async_stream", "bls_async_stream",
              DECOUPLED + tensors("input", "INPUT0 FP32 1") + tensors("output", "OUTPUT0 FP64 2"))
    add_model(repo, "until_cancelled", "until_cancelled",
              DECOUPLED + tensors("input", "INPUT0 INT32 1", "COUNT INT32 1", "DELAY INT32 1",
                                  "IGNORE_CANCEL BOOL 1")
              + tensors("output", "OUTPUT0 INT32 1"))
    add_model(repo, "bls_cancel", "bls_cancel",
              tensors("input", "INPUT0 INT32 1", "MAX_SUM INT32 1", "IGNORE_CANCEL BOOL 1")
              + tensors("output", "SUM INT32 1", "IS_CANCELLED BOOL 1", "COUNT INT32 1")
              + "instance_group [{ count: 2 kind: KIND_CPU }]\n")
    add_control_models(repo)
    add_model(repo, "bls_in_init", "bls_in_init", "")
    return repo


def add_control_models(repo: Path) -> None:
    add_model(repo, "model_control", "model_control",
              tensors("input", "ACTION BYTES 1", "NAME BYTES 1", "VERSION BYTES 1")
              + tensors("output", "OUTPUT0 BOOL 1"))
    add_model(repo, "ctl_target", "identity",
              'backend: "python"\n' + tensors("input", "INPUT0 FP32 -1")
              + tensors("output", "OUTPUT0 FP32 -1"))


STARTUP_MODELS = ("async_decoupled", "repeat", "bls_async_stream", "until_cancelled",
                  "bls_cancel", "model_control")


@pytest.fixture(scope="module", params=instance_kinds())
def explicit_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                    ) -> Iterator[TritiumProcess]:
    repo = build(tmp_path_factory.mktemp("bls_repo"))
    loads = [arg for name in STARTUP_MODELS for arg in ("--load-model", name)]
    process = TritiumProcess(repo, "--model-control-mode", "explicit", *loads,
                             "--python-instance-kind", request.param).start(timeout=120)
    yield process
    code = process.stop()
    assert code == 0, process.log()


# -- item: async BLS calls overlap ---------------------------------------------------


def stream_parents(server: TritiumProcess, count: int, seconds: float, iterate: str
                   ) -> list[np.ndarray]:
    """``count`` bls_async_stream requests on one gRPC stream; their [start, end] pairs."""
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(lambda result, error: results.put((result, error)))
    try:
        for index in range(count):
            data = grpcclient.InferInput("INPUT0", [1], "FP32")
            data.set_data_from_numpy(np.array([seconds], dtype=np.float32))
            client.async_stream_infer("bls_async_stream", [data], request_id=str(index),
                                      parameters={"iterate": iterate})
        spans = []
        for _ in range(count):
            result, error = results.get(timeout=60)
            assert error is None, error
            spans.append(result.as_numpy("OUTPUT0"))
        return spans
    finally:
        client.stop_stream()
        client.close()


def generate_parents(server: TritiumProcess, count: int, seconds: float, iterate: str
                     ) -> list[np.ndarray]:
    """The same over HTTP's generate extension, one thread per request."""
    url = f"http://{server.http_url}/v2/models/bls_async_stream/generate"
    spans: list[np.ndarray] = []
    failures: list[str] = []

    def one() -> None:
        reply = requests.post(url, json={"INPUT0": [seconds], "iterate": iterate}, timeout=60)
        if reply.status_code != 200:
            failures.append(reply.text)
        else:
            spans.append(np.array(reply.json()["OUTPUT0"], dtype=np.float64))

    threads = [threading.Thread(target=one) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures, failures
    return spans


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("iterate", ["for", "async for"])
def test_concurrent_async_decoupled_bls_overlap(explicit_server: TritiumProcess, protocol: str,
                                                iterate: str) -> None:
    """Triton's concurrency test (L0_backend_python/async_execute, "multi request bls"):
    four requests into a decoupled ``async def execute`` that awaits
    ``async_exec(decoupled=True)`` and iterates all finish at about the child's duration,
    not one after another. Triton's async_exec runs the call in an executor and resolves
    once the first response is there, so awaiting it lets the other requests' coroutines
    start their own children. Each parent reports when it started and when its child's
    stream ended: with overlap, every parent started before any of them ended."""
    send = stream_parents if protocol == "grpc" else generate_parents
    spans = send(explicit_server, 4, 1.0, iterate)
    assert len(spans) == 4
    starts, ends = [span[0] for span in spans], [span[1] for span in spans]
    assert min(end - start for start, end in spans) >= 0.9  # each child really took ~1 s
    assert max(starts) < min(ends), spans  # one after another, a start follows an end
    assert max(ends) - min(starts) < 3.5, spans  # serialised, four take 4 s


# -- item: ResponseIterator.cancel() ---------------------------------------------------


def cancel_case(server: TritiumProcess, protocol: str, ignore_cancel: bool) -> dict[str, int]:
    values = {"INPUT0": np.array([1], dtype=np.int32),
              "MAX_SUM": np.array([10], dtype=np.int32),
              "IGNORE_CANCEL": np.array([ignore_cancel], dtype=np.bool_)}
    module: Any = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    client = module.InferenceServerClient(url)
    try:
        inputs = []
        for name, data in values.items():
            tensor = module.InferInput(name, list(data.shape), "BOOL" if data.dtype == bool
                                       else "INT32")
            tensor.set_data_from_numpy(data)
            inputs.append(tensor)
        result = client.infer("bls_cancel", inputs)
        return {name: int(result.as_numpy(name)[0]) for name in ("SUM", "IS_CANCELLED", "COUNT")}
    finally:
        client.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_cancelled_child_that_ignores_it_keeps_streaming(explicit_server: TritiumProcess,
                                                         protocol: str) -> None:
    """Triton's decoupled_bls_cancel with IGNORE_CANCEL (L0_backend_python/decoupled,
    test_decoupled_bls_ignore_cancel): ResponseIterator.cancel() only asks the child's
    request to stop (PbBLSCancel sends TRITONSERVER_InferenceRequestCancel); a child that
    does not look at is_cancelled() goes on, and the iterator yields every response it
    sends, its FINAL included. No error is made up on the way."""
    outcome = cancel_case(explicit_server, protocol, ignore_cancel=True)
    assert outcome == {"SUM": 20, "IS_CANCELLED": 0, "COUNT": 20}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_cancelled_child_that_honours_it_ends_with_its_own_error(
        explicit_server: TritiumProcess, protocol: str) -> None:
    """The same test without IGNORE_CANCEL: the child sees is_cancelled() and ends its
    stream with its own CANCELLED error, which the parent reads as the last response;
    cancel() once the iteration ended is a no-op (decoupled_bls_cancel_after_complete)."""
    outcome = cancel_case(explicit_server, protocol, ignore_cancel=False)
    assert outcome["IS_CANCELLED"] == 1
    assert 10 <= outcome["SUM"] < 20, outcome
    assert outcome["COUNT"] == outcome["SUM"] + 1  # the child's error was the last read


# -- item: the model loading API -----------------------------------------------------


def control(server: TritiumProcess, action: str, name: str, version: str = "") -> bool:
    """Run one model_control action over HTTP; raises InferenceServerException on error."""
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        inputs = []
        for input_name, value in (("ACTION", action), ("NAME", name), ("VERSION", version)):
            tensor = httpclient.InferInput(input_name, [1], "BYTES")
            tensor.set_data_from_numpy(np.array([value.encode()], dtype=np.object_))
            inputs.append(tensor)
        return bool(client.infer("model_control", inputs).as_numpy("OUTPUT0")[0])
    finally:
        client.close()


def control_error(server: TritiumProcess, action: str, name: str, version: str = "") -> str:
    with pytest.raises(InferenceServerException) as caught:
        control(server, action, name, version)
    return str(caught.value)


def doubled(server: TritiumProcess, name: str) -> list[float]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        tensor = grpcclient.InferInput("INPUT0", [2], "FP32")
        tensor.set_data_from_numpy(np.array([1.5, 2.0], dtype=np.float32))
        return client.infer(name, [tensor]).as_numpy("OUTPUT0").tolist()
    finally:
        client.close()


def test_model_loads_and_unloads_another_model(explicit_server: TritiumProcess) -> None:
    """Triton's bls_model_loading test_load_unload_model: is_model_ready is False (or
    raises "Request for unknown model: '<name>'") before the load, True after
    pb_utils.load_model, False again after pb_utils.unload_model, and the loaded model
    serves clients meanwhile. A version string must be an integer, as Triton's
    GetModelVersionFromString wants."""
    server = explicit_server
    assert "Request for unknown model: 'ctl_target'" in control_error(server, "ready",
                                                                      "ctl_target")
    assert control(server, "load", "ctl_target") is False
    assert control(server, "ready", "ctl_target") is True
    assert control(server, "ready", "ctl_target", "1") is True
    assert doubled(server, "ctl_target") == [1.5, 2.0]  # the identity model
    assert "version should be an integral value > 0" in control_error(
        server, "ready", "ctl_target", "one")
    control(server, "unload", "ctl_target")
    with pytest.raises(InferenceServerException, match="Request for unknown model"):
        control(server, "ready", "ctl_target")
    # What the model sees is what clients see.
    assert requests.get(f"http://{server.http_url}/v2/models/ctl_target/ready",
                        timeout=10).status_code != 200


def test_model_loads_with_config_and_file_overrides(explicit_server: TritiumProcess) -> None:
    """pb_utils.load_model(name, config, files): as Triton's model loading API (and the
    repository extension's load), ``files`` ("file:<path>": bytes) form the model
    directory, which needs ``config``; a files argument that is not such a dict raises."""
    server = explicit_server
    try:
        control(server, "load_files", "ctl_override")
        assert control(server, "ready", "ctl_override", "1") is True
        assert doubled(server, "ctl_override") == [3.0, 4.0]  # the uploaded model.py
    finally:
        requests.post(f"http://{server.http_url}/v2/repository/models/ctl_override/unload",
                      timeout=10)
    try:
        control(server, "load_config", "ctl_target")
        assert control(server, "ready", "ctl_target") is True
    finally:
        control(server, "unload", "ctl_target")


def test_bls_from_initialize_fails_the_load(explicit_server: TritiumProcess) -> None:
    """Triton's stub refuses BLS before initialize() returned (InferRequest::Exec:
    "BLS is only supported during the 'execute' function."), so a model that calls
    another from initialize() fails to load (L0_backend_python bls_init_error) instead
    of coming up READY."""
    server = explicit_server
    url = f"http://{server.http_url}/v2/repository/models/bls_in_init"
    reply = requests.post(f"{url}/load", timeout=60)
    assert reply.status_code == 400, reply.text
    assert "BLS is only supported during the 'execute' function." in reply.json()["error"]
    ready = requests.get(f"http://{server.http_url}/v2/models/bls_in_init/ready", timeout=10)
    assert ready.status_code != 200


@pytest.fixture(scope="module", params=instance_kinds())
def default_mode_server(request: pytest.FixtureRequest,
                        tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritiumProcess]:
    repo = tmp_path_factory.mktemp("control_repo")
    add_control_models(repo)
    process = TritiumProcess(repo, "--python-instance-kind", request.param).start(timeout=120)
    yield process
    code = process.stop()
    assert code == 0, process.log()


def test_model_loading_needs_explicit_control_mode(default_mode_server: TritiumProcess) -> None:
    """Triton's python backend README: the model loading API works only when the server
    runs with --model-control-mode=explicit (the core refuses a load or unload otherwise,
    "explicit model load / unload is not allowed ..."); readiness checks work in any
    mode. Errors reach the model as TritonModelException with Triton's stub prefixes."""
    server = default_mode_server
    load = control_error(server, "load", "ctl_target")
    assert "TritonModelException: Failed to load model: explicit model load / unload is "\
           "not allowed" in load, load
    unload = control_error(server, "unload", "ctl_target")
    assert "TritonModelException: Failed to unload model: explicit model load" in unload
    assert control(server, "ready", "ctl_target") is True
