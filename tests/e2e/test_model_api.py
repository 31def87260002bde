"""The model API as Triton's python backend gives it: names as bytes, the model's
directory on sys.path, the model's own sys.argv, writable inputs that cross DLPack, and
non-decoupled models answering through their response sender.

Each scenario runs over HTTP and gRPC against one server on its own repository (explicit
model control, so that a model can be swapped under it).
"""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.server_process import TritiumProcess
from tests.zoo import add_model

IO = ('input [{ name: "MODE" data_type: TYPE_STRING dims: [1] },'
      ' { name: "INPUT0" data_type: TYPE_FP32 dims: [-1] }]\n')
MODEL_API = ('backend: "python"\n' + IO
             + 'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [-1] },'
             ' { name: "TEXT" data_type: TYPE_STRING dims: [1] }]\n')
LATE_SENDER = ('backend: "python"\n' + IO
               + 'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [-1] }]\n')
IDENTITY = ('backend: "python"\ninput [{ name: "INPUT0" data_type: TYPE_FP32 dims: [-1] }]\n'
            'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [-1] }]\n')
PROTOCOLS = ("http", "grpc")
WAIT_S = 30.0


def write_model_api(repo: Path, name: str, helper_name: str) -> None:
    model_dir = add_model(repo, name, "model_api", MODEL_API)
    (model_dir / "1" / "helper.py").write_text(f"NAME = {helper_name!r}\n")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("model_api_repo")
    write_model_api(root, "model_api", "first")
    write_model_api(root, "model_api_twin", "twin")
    add_model(root, "late_sender", "late_sender", LATE_SENDER)
    add_model(root, "late_sender_async", "late_sender_async", LATE_SENDER)
    add_model(root, "identity_fp32", "identity", IDENTITY)
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[TritiumProcess]:
    process = TritiumProcess(
        repo, "--model-control-mode=explicit", "--load-model", "model_api",
        "--load-model", "late_sender", "--load-model", "late_sender_async",
        "--load-model", "identity_fp32").start()
    yield process
    assert process.stop() == 0, process.log()


def inputs(module: Any, mode: str, values: list[float]) -> list[Any]:
    """MODE and INPUT0 as binary data (HTTP binary extension, gRPC raw contents)."""
    mode_input = module.InferInput("MODE", [1], "BYTES")
    data_input = module.InferInput("INPUT0", [len(values)], "FP32")
    if module is httpclient:
        mode_input.set_data_from_numpy(np.array([mode.encode()], np.object_), binary_data=True)
        data_input.set_data_from_numpy(np.array(values, np.float32), binary_data=True)
    else:
        mode_input.set_data_from_numpy(np.array([mode.encode()], np.object_))
        data_input.set_data_from_numpy(np.array(values, np.float32))
    return [mode_input, data_input]


def infer(server: TritiumProcess, protocol: str, model: str, mode: str,
          values: list[float]) -> Any:
    if protocol == "http":
        with httpclient.InferenceServerClient(server.http_url,
                                              network_timeout=WAIT_S) as client:
            return client.infer(model, inputs(httpclient, mode, values))
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        return client.infer(model, inputs(grpcclient, mode, values), client_timeout=WAIT_S)


def report(result: Any) -> dict[str, Any]:
    text: dict[str, Any] = json.loads(result.as_numpy("TEXT")[0])
    return text


def stream(server: TritiumProcess, model: str, mode: str, values: list[float]) -> list[Any]:
    """Every (result, error) a gRPC stream delivers for one request, until it closes."""
    received: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(lambda result, error: received.put((result, error)))
        client.async_stream_infer(model, inputs(grpcclient, mode, values))
        client.stop_stream()  # waits until the server has ended the stream
    return [received.get_nowait() for _ in range(received.qsize())]


# -- 1. names given as bytes ---------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bls_request_names_may_be_bytes(server: TritiumProcess, protocol: str) -> None:
    """Triton's InferenceRequest binds model_name, request_id and each requested output
    name as std::string, and pybind11 fills those from bytes too; Tensor's name alike."""
    result = infer(server, protocol, "model_api", "bls_bytes", [1.5, 2.5])
    assert result.as_numpy("OUTPUT0").tolist() == [1.5, 2.5]
    assert report(result) == {"request_model_name": "identity_fp32", "request_id": "child-id"}


# -- 2. the model's directory stays on sys.path ----------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_helper_next_to_model_imports_inside_execute(server: TritiumProcess,
                                                     protocol: str) -> None:
    """Triton's stub appends the version directory and the model directory to sys.path
    before importing model.py and never takes them away."""
    result = infer(server, protocol, "model_api", "helper", [0.0])
    assert report(result) == {"helper": "first"}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unittest_main_finds_the_model_module(server: TritiumProcess, protocol: str) -> None:
    """Triton's QA models call unittest.main("model"): it imports model.py by name from
    sys.path, and parses sys.argv (empty in the stub) without exiting."""
    result = infer(server, protocol, "model_api", "unittest", [0.0])
    assert report(result) == {"run": 1, "ok": True}


def test_models_with_helpers_of_one_name_each_get_their_own(server: TritiumProcess) -> None:
    """Each Triton model instance has its own stub process, so a helper.py in one model
    is not the same-named helper.py of another; after an unload and load the files are
    read afresh."""
    twin_helper = server.repository / "model_api_twin" / "1" / "helper.py"
    with httpclient.InferenceServerClient(server.http_url, network_timeout=WAIT_S) as client:
        client.load_model("model_api_twin")
        try:
            assert report(infer(server, "http", "model_api_twin", "helper", [0.0])) == {
                "helper": "twin"}
            assert report(infer(server, "grpc", "model_api", "helper", [0.0])) == {
                "helper": "first"}
            client.unload_model("model_api_twin")
            twin_helper.write_text("NAME = 'twin, reloaded'\n")
            client.load_model("model_api_twin")
            assert report(infer(server, "grpc", "model_api_twin", "helper", [0.0])) == {
                "helper": "twin, reloaded"}
        finally:
            client.unload_model("model_api_twin")


# -- 3. the model's own sys.argv -----------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_model_sees_its_own_argv(server: TritiumProcess, protocol: str) -> None:
    """Triton's stub starts its embedded Python with no arguments, so sys.argv is [""]
    and argparse finds nothing to parse (not `tritium serve ...`, which exits with 2)."""
    result = infer(server, protocol, "model_api", "argv", [0.0])
    assert report(result) == {"argv": [""], "parsed": {}}


# -- 4. binary inputs are writable and cross DLPack ------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_binary_inputs_are_writable_and_export_through_dlpack(server: TritiumProcess,
                                                              protocol: str) -> None:
    """Triton's input tensors live in writable memory; to_dlpack() of a read-only array
    fails with BufferError (what torch.utils.dlpack.from_dlpack would raise)."""
    result = infer(server, protocol, "model_api", "writable", [1.0, 2.0, 3.0])
    assert report(result) == {"writeable": True, "shares_memory": True}
    assert result.as_numpy("OUTPUT0").tolist() == [2.0, 3.0, 4.0]


# -- 6. a non-decoupled model that returns None and answers later ----------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("mode", ["after_return", "after_return_list"])
def test_response_sent_after_execute_returned(server: TritiumProcess, protocol: str,
                                              mode: str) -> None:
    """Triton's stub returns early when execute() gives None, leaving every request to
    its response sender (its test of one response after return expects it through)."""
    result = infer(server, protocol, "late_sender", mode, [4.0])
    assert result.as_numpy("OUTPUT0").tolist() == [4.0]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_async_execute_returning_none_answers_later(server: TritiumProcess,
                                                    protocol: str) -> None:
    """Triton runs its response-sender tests on an async variant of the model as well."""
    result = infer(server, protocol, "late_sender_async", "", [6.0])
    assert result.as_numpy("OUTPUT0").tolist() == [6.0]


def test_response_sent_after_return_over_a_stream(server: TritiumProcess) -> None:
    [(result, error)] = stream(server, "late_sender", "after_return", [5.0])
    assert error is None and result.as_numpy("OUTPUT0").tolist() == [5.0]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_request_let_go_without_a_response_fails(server: TritiumProcess, protocol: str) -> None:
    """Where Triton would leave the client waiting, tritium ends the request once the
    model holds neither it nor its sender."""
    with pytest.raises(InferenceServerException, match="let go of it"):
        infer(server, protocol, "late_sender", "abandon", [1.0])


# -- 7. a non-decoupled model that sends twice -----------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("mode", ["two_before_return", "sent_and_returned"])
def test_first_response_is_kept(server: TritiumProcess, protocol: str, mode: str) -> None:
    """Triton's response-sender tests: the first response reaches the client; the second
    send raises in the model (or the returned response is refused), and the error that
    follows is not delivered."""
    result = infer(server, protocol, "late_sender", mode, [7.0])
    assert result.as_numpy("OUTPUT0").tolist() == [7.0]


@pytest.mark.parametrize("mode", ["two_before_return", "sent_and_returned"])
def test_stream_gets_only_the_first_response(server: TritiumProcess, mode: str) -> None:
    """Over a gRPC stream Triton's frontend discards whatever a non-decoupled model's
    request produces after its first response, the later error included."""
    responses = stream(server, "late_sender", mode, [8.0])
    assert [(error, result.as_numpy("OUTPUT0").tolist()) for result, error in responses] == [
        (None, [8.0])]
