"""PythonBackend: model.py loading, initialize, execute (sync, async, decoupled)."""

from __future__ import annotations

import asyncio
import json
import textwrap
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tritium.backends.python import PythonBackend, auto_complete_config, create_python_backend
from tritium.backends.python.link import LocalLink
from tritium.core.cancellation import Cancellation, CancelReason
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.request import AdmittedRequest, InferenceRequest, RequestedOutput
from tritium.core.response import InferenceResponse, ResponseStream
from tritium.core.types import DataType, Tensor
from tritium.execution.backend import InstanceInfo

WAIT_S = 10.0

IDENTITY_CONFIG = """
name: "{name}"
backend: "python"
input [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }}]
output [
  {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ -1 ] }}
]
"""

IDENTITY_MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.args = args

    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", data),
                pb_utils.Tensor("OUTPUT1", data * 2),
                pb_utils.Tensor("NOT_IN_CONFIG", data),
            ]))
        return responses

    def finalize(self):
        self.finalized = True
"""


# -- helpers shared with test_python_bls.py --------------------------------------------


def write_model(root: Path, name: str, source: str, config_text: str | None = None) -> Path:
    """Write <root>/<name>/1/model.py; returns the model directory."""
    model_dir = root / name
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.py").write_text(textwrap.dedent(source))
    text = (config_text or IDENTITY_CONFIG).format(name=name)
    (model_dir / "config.pbtxt").write_text(text)
    return model_dir


def load_config(model_dir: Path) -> Any:
    config = model_config_pb2.ModelConfig()
    text_format.Parse((model_dir / "config.pbtxt").read_text(), config)
    return config


def make_backend(model_dir: Path, service: Any = None) -> PythonBackend:
    config = load_config(model_dir)
    info = InstanceInfo(
        model_name=config.name,
        model_version=1,
        model_repository=str(model_dir),
        config_json=json.dumps({"name": config.name}),
        instance_name=f"{config.name}_0_0",
        kind="CPU",
        device_id=0,
    )
    return create_python_backend(info, config, None if service is None else LocalLink(service))


def fp32_request(values: list[float], outputs: list[str] | None = None) -> InferenceRequest:
    data = np.array(values, dtype=np.float32)
    return InferenceRequest(
        model_name="m",
        inputs={"INPUT0": Tensor("INPUT0", DataType.FP32, data.shape, data)},
        requested_outputs=None if outputs is None else [RequestedOutput(n) for n in outputs],
    )


async def collect(stream: ResponseStream) -> list[InferenceResponse]:
    async with asyncio.timeout(WAIT_S):
        return [response async for response in stream]


def admit_all(requests: list[InferenceRequest]) -> list[AdmittedRequest]:
    """Give each request a stream and cancellation on the running loop. The stream does
    not follow the cancellation: the model's own reaction to a cancel reaches the test."""
    loop = asyncio.get_running_loop()
    return [AdmittedRequest(r, Cancellation(loop), ResponseStream(loop)) for r in requests]


async def start(backend: PythonBackend, requests: list[AdmittedRequest]) -> None:
    """Run execute the way an instance does: on another thread, an async execute on
    that thread's own loop."""
    loop = asyncio.get_running_loop()
    result = await loop.run_in_executor(None, backend.execute, requests)
    if result is not None:
        await loop.run_in_executor(None, _run_on_own_loop, result)


def _run_on_own_loop(awaitable: Awaitable[None]) -> None:
    async def main() -> None:
        await awaitable

    asyncio.run(main())


def run_batch(backend: PythonBackend, requests: list[InferenceRequest]) -> list[list[Any]]:
    async def main() -> list[list[Any]]:
        admitted = admit_all(requests)
        await start(backend, admitted)
        return [await collect(request.stream) for request in admitted]

    return asyncio.run(main())


def single_error(responses: list[InferenceResponse]) -> TritiumError:
    assert len(responses) == 1 and responses[0].final
    assert responses[0].error is not None
    return responses[0].error


# -- loading ---------------------------------------------------------------------------


def test_initialize_gets_triton_args(tmp_path: Path) -> None:
    backend = make_backend(write_model(tmp_path, "ident", IDENTITY_MODEL))
    args = backend.model.args
    assert set(args) == {
        "model_config",
        "model_instance_kind",
        "model_instance_name",
        "model_instance_device_id",
        "model_repository",
        "model_version",
        "model_name",
    }
    assert all(isinstance(value, str) for value in args.values())
    assert args["model_version"] == "1" and args["model_instance_device_id"] == "0"
    assert json.loads(args["model_config"])["name"] == "ident"
    assert not backend.decoupled and not backend.is_async


def test_initialize_error_becomes_tritium_error(tmp_path: Path) -> None:
    source = """
    class TritonPythonModel:
        def initialize(self, args):
            raise ValueError("weights missing")
    """
    with pytest.raises(TritiumError, match="ValueError: weights missing"):
        make_backend(write_model(tmp_path, "bad", source))


def test_missing_model_class_is_reported(tmp_path: Path) -> None:
    with pytest.raises(TritiumError, match="TritonPythonModel"):
        make_backend(write_model(tmp_path, "empty", "X = 1\n"))


def test_syntax_error_is_reported(tmp_path: Path) -> None:
    with pytest.raises(TritiumError, match="SyntaxError"):
        make_backend(write_model(tmp_path, "broken", "def (:\n"))


def test_two_models_with_same_file_name_do_not_clash(tmp_path: Path) -> None:
    source = """
    from .helper import VALUE

    class TritonPythonModel:
        def initialize(self, args):
            self.value = VALUE
    """
    first = write_model(tmp_path, "first", source)
    second = write_model(tmp_path, "second", source)
    (first / "1" / "helper.py").write_text("VALUE = 'first'\n")
    (second / "1" / "helper.py").write_text("VALUE = 'second'\n")
    assert make_backend(first).model.value == "first"
    assert make_backend(second).model.value == "second"


def test_finalize_is_called(tmp_path: Path) -> None:
    backend = make_backend(write_model(tmp_path, "ident", IDENTITY_MODEL))
    backend.finalize()
    assert backend.model.finalized is True


# -- non-decoupled execute -------------------------------------------------------------


def test_identity_passes_arrays_without_copy(tmp_path: Path) -> None:
    backend = make_backend(write_model(tmp_path, "ident", IDENTITY_MODEL))
    request = fp32_request([1.0, 2.0])
    [responses] = run_batch(backend, [request])
    assert len(responses) == 1 and responses[0].final and responses[0].error is None
    outputs = {tensor.name: tensor for tensor in responses[0].outputs}
    # Every config output when none was requested; an output the config lacks is dropped.
    assert set(outputs) == {"OUTPUT0", "OUTPUT1"}
    assert outputs["OUTPUT0"].data is request.inputs["INPUT0"].data
    assert outputs["OUTPUT1"].datatype is DataType.FP32 and outputs["OUTPUT1"].shape == (2,)
    np.testing.assert_array_equal(outputs["OUTPUT1"].data, [2.0, 4.0])


def test_outputs_not_requested_are_dropped(tmp_path: Path) -> None:
    backend = make_backend(write_model(tmp_path, "ident", IDENTITY_MODEL))
    [responses] = run_batch(backend, [fp32_request([1.0], outputs=["OUTPUT1"])])
    assert [tensor.name for tensor in responses[0].outputs] == ["OUTPUT1"]


def test_batch_of_requests_gets_one_response_each(tmp_path: Path) -> None:
    backend = make_backend(write_model(tmp_path, "ident", IDENTITY_MODEL))
    results = run_batch(backend, [fp32_request([1.0]), fp32_request([5.0, 6.0])])
    assert [r[0].outputs[0].data.tolist() for r in results] == [[1.0], [5.0, 6.0]]


def test_request_accessors(tmp_path: Path) -> None:
    source = """
    import json
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            request = requests[0]
            self.seen = dict(
                id=request.request_id(), correlation=request.correlation_id(),
                flags=request.flags(), timeout=request.timeout(),
                parameters=json.loads(request.parameters()),
                outputs=request.requested_output_names(),
                inputs=[tensor.name() for tensor in request.inputs()],
                cancelled=request.is_cancelled(),
            )
            return [pb_utils.InferenceResponse([])]
    """
    backend = make_backend(write_model(tmp_path, "acc", source))
    request = fp32_request([1.0])
    request.id, request.correlation_id, request.flags, request.timeout_us = "r1", "seq", 3, 500
    request.parameters = {"a": 1, "b": "x", "c": True}
    run_batch(backend, [request])
    assert backend.model.seen == {
        "id": "r1",
        "correlation": "seq",
        "flags": 3,
        "timeout": 500,
        "parameters": {"a": 1, "b": "x", "c": True},
        "outputs": ["OUTPUT0", "OUTPUT1"],
        "inputs": ["INPUT0"],
        "cancelled": False,
    }


def test_exception_fails_every_request(tmp_path: Path) -> None:
    source = """
    class TritonPythonModel:
        def execute(self, requests):
            raise RuntimeError("boom")
    """
    backend = make_backend(write_model(tmp_path, "raise", source))
    for responses in run_batch(backend, [fp32_request([1.0]), fp32_request([2.0])]):
        error = single_error(responses)
        assert error.code is ErrorCode.INTERNAL
        # Triton's stub is named after the instance, and so is the model in this text.
        assert error.message == (
            "Failed to process the request(s) for model 'raise_0_0', message: RuntimeError: boom"
        )


@pytest.mark.parametrize(
    ("returned", "expected"),
    [
        ("[]", "Number of InferenceResponse objects do not match"),
        ("tuple(pb_utils.InferenceResponse([]) for _ in requests)", "Expected a list"),
        ("[object() for _ in requests]", "Expected an 'InferenceResponse' object"),
    ],
)
def test_bad_return_value_fails_every_request(tmp_path: Path, returned: str, expected: str) -> None:
    source = f"""
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return {returned}
    """
    backend = make_backend(write_model(tmp_path, "wrong", source))
    for responses in run_batch(backend, [fp32_request([1.0]), fp32_request([2.0])]):
        error = single_error(responses)
        assert error.code is ErrorCode.INTERNAL and expected in error.message


def test_error_response_keeps_its_code(tmp_path: Path) -> None:
    source = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            error = pb_utils.TritonError("stopped", pb_utils.TritonError.CANCELLED)
            return [pb_utils.InferenceResponse(error=error) for _ in requests]
    """
    backend = make_backend(write_model(tmp_path, "err", source))
    [responses] = run_batch(backend, [fp32_request([1.0])])
    error = single_error(responses)
    assert (error.code, error.message) == (ErrorCode.CANCELLED, "stopped")


def test_sender_in_non_decoupled_model(tmp_path: Path) -> None:
    source = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            sender = requests[0].get_response_sender()
            final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            sender.send(pb_utils.InferenceResponse([]), flags=final)
            try:
                sender.send(pb_utils.InferenceResponse([]))
            except pb_utils.TritonModelException as exc:
                self.second_send = str(exc)
            return [None, None]
    """
    backend = make_backend(write_model(tmp_path, "sender", source))
    sent, forgotten = run_batch(backend, [fp32_request([1.0]), fp32_request([2.0])])
    assert len(sent) == 1 and sent[0].error is None and sent[0].final
    assert "more than one response" in backend.model.second_send
    # None for a request whose sender never sent FINAL: that request fails, not hangs.
    assert single_error(forgotten).code is ErrorCode.INTERNAL


def test_async_execute(tmp_path: Path) -> None:
    source = """
    import asyncio
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        async def execute(self, requests):
            await asyncio.sleep(0)
            return [
                pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                for r in requests
            ]
    """
    backend = make_backend(write_model(tmp_path, "async_ident", source))
    assert backend.is_async
    [responses] = run_batch(backend, [fp32_request([3.0])])
    assert responses[0].outputs[0].data.tolist() == [3.0]


def test_async_execute_exception(tmp_path: Path) -> None:
    source = """
    class TritonPythonModel:
        async def execute(self, requests):
            raise KeyError("k")
    """
    backend = make_backend(write_model(tmp_path, "async_raise", source))
    [responses] = run_batch(backend, [fp32_request([3.0])])
    assert "message: KeyError: 'k'" in single_error(responses).message


# -- decoupled -------------------------------------------------------------------------

DECOUPLED_CONFIG = IDENTITY_CONFIG + "model_transaction_policy {{ decoupled: true }}\n"

DECOUPLED_MODEL = """
import threading
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.after_final = None
        self.done = threading.Event()

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.stream, args=(request,)).start()
        return None

    def stream(self, request):
        sender = request.get_response_sender()
        data = request.inputs()[0].as_numpy()
        for i in range(3):
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data + i)]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        try:
            sender.send(pb_utils.InferenceResponse([]))
        except pb_utils.TritonModelException as exc:
            self.after_final = str(exc)
        self.done.set()
"""


def test_decoupled_sends_from_thread_after_execute_returned(tmp_path: Path) -> None:
    backend = make_backend(write_model(tmp_path, "dec", DECOUPLED_MODEL, DECOUPLED_CONFIG))
    assert backend.decoupled
    [responses] = run_batch(backend, [fp32_request([1.0])])
    assert [r.outputs[0].data.tolist() for r in responses[:3]] == [[1.0], [2.0], [3.0]]
    assert not any(r.final for r in responses[:3])
    assert responses[3].final and responses[3].flag_only
    assert backend.model.done.wait(WAIT_S)
    assert backend.model.after_final == "Unable to send response. Response sender has been closed."


def test_decoupled_returning_a_list_is_an_error(tmp_path: Path) -> None:
    source = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([]) for _ in requests]
    """
    backend = make_backend(write_model(tmp_path, "declist", source, DECOUPLED_CONFIG))
    [responses] = run_batch(backend, [fp32_request([1.0])])
    assert "must return None" in single_error(responses).message


CANCEL_AWARE_MODEL = """
import threading, time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.run, args=(request,)).start()

    def run(self, request):
        sender = request.get_response_sender()
        sender.send(pb_utils.InferenceResponse([]))
        deadline = time.monotonic() + 30
        # A model polls; this is the model's loop, not the test waiting.
        while not request.is_cancelled() and time.monotonic() < deadline:
            time.sleep(0.001)
        self.sender_saw = sender.is_cancelled()
        error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
        sender.send(pb_utils.InferenceResponse(error=error),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""


def test_is_cancelled_follows_core_cancellation(tmp_path: Path) -> None:
    backend = make_backend(write_model(tmp_path, "cancel", CANCEL_AWARE_MODEL, DECOUPLED_CONFIG))
    async def main() -> list[InferenceResponse]:
        [request] = admit_all([fp32_request([1.0])])
        await start(backend, [request])
        async with asyncio.timeout(WAIT_S):
            first = await request.stream.receive()
        assert not first.final
        request.cancellation.cancel(CancelReason.CLIENT_CANCELLED)
        return await collect(request.stream)

    rest = asyncio.run(main())
    assert single_error(rest).code is ErrorCode.CANCELLED
    assert backend.model.sender_saw is True


def test_async_decoupled_execute(tmp_path: Path) -> None:
    source = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        async def execute(self, requests):
            for request in requests:
                sender = request.get_response_sender()
                out = pb_utils.Tensor("OUTPUT0", request.inputs()[0].as_numpy())
                sender.send(pb_utils.InferenceResponse([out]),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    """
    backend = make_backend(write_model(tmp_path, "adec", source, DECOUPLED_CONFIG))
    assert backend.is_async and backend.decoupled
    [responses] = run_batch(backend, [fp32_request([7.0])])
    assert len(responses) == 1 and responses[0].final
    assert responses[0].outputs[0].data.tolist() == [7.0]


# -- auto-complete ---------------------------------------------------------------------

AUTO_COMPLETE_MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.set_max_batch_size(8)
        config.add_input({"name": "IN", "data_type": "TYPE_INT64", "dims": [4]})
        config.add_output({"name": "OUT", "data_type": "TYPE_STRING", "dims": [-1]})
        config.set_model_transaction_policy({"decoupled": True})
        config.set_dynamic_batching()
        return config
"""


def test_auto_complete_config(tmp_path: Path) -> None:
    model_dir = write_model(tmp_path, "auto", AUTO_COMPLETE_MODEL, 'name: "{name}"\n')
    config = load_config(model_dir)
    completed = auto_complete_config(model_dir, config)
    assert isinstance(completed, model_config_pb2.ModelConfig)
    assert completed.max_batch_size == 8
    assert [(t.name, t.data_type, list(t.dims)) for t in completed.input] == [
        ("IN", model_config_pb2.TYPE_INT64, [4])
    ]
    assert completed.output[0].data_type == model_config_pb2.TYPE_STRING
    assert completed.model_transaction_policy.decoupled
    assert completed.HasField("dynamic_batching")
    assert config.max_batch_size == 0, "the caller's config is not changed"


def test_auto_complete_absent_returns_config(tmp_path: Path) -> None:
    model_dir = write_model(tmp_path, "plain", IDENTITY_MODEL)
    config = load_config(model_dir)
    assert auto_complete_config(model_dir, config) == config


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("return None", "must return a valid pb.ModelConfig object"),
        (
            'config.add_input({"name": "INPUT0", "data_type": "TYPE_INT8", "dims": [-1]})',
            "configuration expects datatype TYPE_FP32",
        ),
    ],
)
def test_auto_complete_errors(tmp_path: Path, body: str, expected: str) -> None:
    source = f"""
    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(config):
            {body}
    """
    model_dir = write_model(tmp_path, "autobad", source)
    with pytest.raises(TritiumError, match=expected) as caught:
        auto_complete_config(model_dir, load_config(model_dir))
    assert caught.value.code is ErrorCode.INVALID_ARG
