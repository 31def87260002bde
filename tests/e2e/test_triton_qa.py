"""Triton's own python-backend QA scenarios (qa/L0_backend_python), run against tritium:
argument validation inside a model, BF16 through DLPack, BLS requests carrying sequence
flags, the three-step ``ensemble_io`` (plain and decoupled steps) and requested outputs of
a decoupled model on a stream the client closes at once."""

from __future__ import annotations

import itertools
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.conftest import instance_kinds
from tests.server_process import TritiumProcess
from tests.zoo import DECOUPLED, SEQUENCE_CONTROLS, SEQUENCE_IO, _parameter, _tensor, add_model

PROTOCOLS = {"http": httpclient, "grpc": grpcclient}
TEXT_OUT = _tensor("output", "OUTPUT0", "BYTES", "1")
IO = (_tensor("input", "INPUT0", "FP32", "-1") + _tensor("input", "GPU_OUTPUT", "BOOL", "-1")
      + _tensor("output", "OUTPUT0", "FP32", "-1")
      + _tensor("output", "NEXT_GPU_OUTPUT", "BOOL", "-1"))
STEP_DELAY = _parameter("delay", "0.2")


def _ensemble(name: str, steps: str) -> str:
    """Triton's ensemble_io: INPUT0/GPU_OUTPUT through ``{steps}_1`` .. ``_3``."""
    maps = []
    for index in (1, 2, 3):
        source = ("INPUT0", "GPU_OUTPUT") if index == 1 else (f"out_{index - 1}",
                                                              f"next_{index - 1}")
        target = ("OUTPUT0", "NEXT_GPU_OUTPUT") if index == 3 else (f"out_{index}",
                                                                    f"next_{index}")
        maps.append(f'step {{ model_name: "{steps}_{index}" model_version: -1 '
                    f'input_map {{ key: "INPUT0" value: "{source[0]}" }} '
                    f'input_map {{ key: "GPU_OUTPUT" value: "{source[1]}" }} '
                    f'output_map {{ key: "OUTPUT0" value: "{target[0]}" }} '
                    f'output_map {{ key: "NEXT_GPU_OUTPUT" value: "{target[1]}" }} }}')
    return (f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 0\n' + IO
            + "ensemble_scheduling {\n" + "\n".join(maps) + "\n}\n")


def build(repo: Path, records: Path) -> Path:
    add_model(repo, "argument_validation", "argument_validation", TEXT_OUT)
    add_model(repo, "identity_bf16", "bf16_dlpack",
              "max_batch_size: 64\n" + _tensor("input", "INPUT0", "BF16", "-1")
              + _tensor("output", "OUTPUT0", "BF16", "-1"))
    add_model(repo, "sequence_accumulator", "accumulator",
              "sequence_batching {\n  direct {}\n" + SEQUENCE_CONTROLS + "}\n" + SEQUENCE_IO
              + _parameter("record_file", f"{records}/sequence_accumulator.jsonl"))
    for trial in ("false", "true"):
        add_model(repo, f"bls_sequence_{trial}", "bls_sequence",
                  TEXT_OUT + _parameter("decoupled", trial))
    for index in (1, 2, 3):
        add_model(repo, f"dlpack_io_identity_{index}", "dlpack_io", IO)
        add_model(repo, f"dlpack_io_decoupled_{index}", "dlpack_io",
                  DECOUPLED + IO + STEP_DELAY)
    add_model(repo, "dlpack_io_identity_decoupled", "dlpack_io", DECOUPLED + IO + STEP_DELAY)
    for name, steps in (("ensemble_io", "dlpack_io_identity"),
                        ("ensemble_io_decoupled", "dlpack_io_decoupled")):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(_ensemble(name, steps))
    return repo


@pytest.fixture(scope="module", params=instance_kinds())
def qa_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[TritiumProcess]:
    repo = build(tmp_path_factory.mktemp("qa_repo"), tmp_path_factory.mktemp("qa_records"))
    process = TritiumProcess(repo, "--python-instance-kind", request.param).start(timeout=120)
    yield process
    code = process.stop()
    assert code == 0, process.log()


def _client(server: TritiumProcess, protocol: str) -> Any:
    url = server.http_url if protocol == "http" else server.grpc_url
    return PROTOCOLS[protocol].InferenceServerClient(url)


def _text(server: TritiumProcess, protocol: str, model: str) -> str:
    result = _client(server, protocol).infer(model, [])
    return str(result.as_numpy("OUTPUT0")[0].decode())


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_argument_validation(qa_server: TritiumProcess, protocol: str) -> None:
    """None where Triton's binding refuses it is a TypeError, None inside a tensor list
    Triton's TritonModelException (test_tensor_args, test_infer_request/response_args)."""
    assert _text(qa_server, protocol, "argument_validation") == "ok"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bf16_moves_through_dlpack_and_as_numpy_refuses(qa_server: TritiumProcess,
                                                       protocol: str) -> None:
    values = np.array([[1.5, -2.0, 0.25]], dtype=ml_dtypes.bfloat16)
    if protocol == "http":
        tensor = httpclient.InferInput("INPUT0", [1, 3], "BF16")
        tensor.set_data_from_numpy(values, binary_data=True)
        result = _client(qa_server, protocol).infer("identity_bf16", [tensor])
        assert result.get_output("OUTPUT0")["datatype"] == "BF16"
        back = result.as_numpy("OUTPUT0").astype(np.float32)
        assert back.tolist() == values.astype(np.float32).tolist()
        return
    tensor = grpcclient.InferInput("INPUT0", [1, 3], "BF16")
    tensor._raw_content = values.tobytes()  # the client refuses bfloat16 arrays for BF16
    response = _client(qa_server, protocol).infer("identity_bf16", [tensor]).get_response()
    assert response.outputs[0].datatype == "BF16"
    assert response.raw_output_contents[0] == values.tobytes()


@pytest.mark.parametrize("trial", ["false", "true"])
def test_bls_requests_carry_sequence_flags(qa_server: TritiumProcess, trial: str) -> None:
    """Two sequences at once from one BLS model: START, ten requests with only the
    correlation id (``exec(decoupled=True)`` in the decoupled trial), END."""
    assert _text(qa_server, "grpc", f"bls_sequence_{trial}") == "ok"


def _io_inputs(values: np.ndarray, flags: np.ndarray) -> list[grpcclient.InferInput]:
    inputs = [grpcclient.InferInput("INPUT0", list(values.shape), "FP32"),
              grpcclient.InferInput("GPU_OUTPUT", list(flags.shape), "BOOL")]
    inputs[0].set_data_from_numpy(values)
    inputs[1].set_data_from_numpy(flags)
    return inputs


@pytest.mark.parametrize(("model", "per_request"), [("ensemble_io", 1),
                                                    ("ensemble_io_decoupled", 8)])
def test_ensemble_io(qa_server: TritiumProcess, model: str, per_request: int) -> None:
    """IOTest.test_ensemble_io over a gRPC stream: every step's output reaches the next,
    NEXT_GPU_OUTPUT ends empty, and decoupled steps (two responses each) give 2**3."""
    received: queue.Queue[Any] = queue.Queue()
    values = np.random.default_rng(0).random(1000, dtype=np.float32)
    combinations = list(itertools.product((True, False), repeat=3))
    with _client(qa_server, "grpc") as client:
        client.start_stream(callback=lambda result, error: received.put(error or result))
        for combination in combinations:
            client.async_stream_infer(model, _io_inputs(values, np.array(combination)))
        for _ in range(len(combinations) * per_request):
            result = received.get(timeout=60)
            assert not isinstance(result, Exception), result
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values)
            assert result.as_numpy("NEXT_GPU_OUTPUT").shape == (0,)
    assert received.empty()


def test_requested_output_decoupled(qa_server: TritiumProcess) -> None:
    """A decoupled model's two responses carry only the requested output, and all of them
    arrive though the client closes its side of the stream straight after the request."""
    values = np.array([0.5, 1.5, 2.5, 3.5], dtype=np.float32)
    flags = np.array([True, False, True, True])
    outputs_asked = [grpcclient.InferRequestedOutput("OUTPUT0")]
    for requested, names in ((outputs_asked, ["OUTPUT0"]),
                             (None, ["OUTPUT0", "NEXT_GPU_OUTPUT"])):
        results = _stream_and_close(qa_server, _io_inputs(values, flags), requested)
        assert len(results) == 2
        for result in results:
            assert sorted(o.name for o in result.get_response().outputs) == sorted(names)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values)


def _stream_and_close(server: TritiumProcess, inputs: list[grpcclient.InferInput],
                      outputs: list[grpcclient.InferRequestedOutput] | None) -> list[Any]:
    """What one request on a stream brings when the client ends the stream at once."""
    received: queue.Queue[Any] = queue.Queue()
    with _client(server, "grpc") as client:
        client.start_stream(callback=lambda result, error: received.put(error or result))
        client.async_stream_infer("dlpack_io_identity_decoupled", inputs, outputs=outputs)
        client.stop_stream()  # returns once the server has ended the stream
    return [received.get_nowait() for _ in range(received.qsize())]
