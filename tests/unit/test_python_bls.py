"""BLS from model code, against a fake InferenceService.submit (no server)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from tests.unit.test_python_backend import (
    WAIT_S,
    admit_all,
    collect,
    fp32_request,
    make_backend,
    single_error,
    start,
    write_model,
)
from tritium.core.cancellation import Cancellation, CancelReason
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.request import AdmittedRequest, InferenceRequest
from tritium.core.response import InferenceResponse, ResponseStream
from tritium.core.types import Tensor

PARENT_MODEL = """
import json
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [self.one(request) for request in requests]

    def one(self, request):
        params = json.loads(request.parameters())
        child = pb_utils.InferenceRequest(
            model_name=params["target"], inputs=[request.inputs()[0]],
            requested_output_names=["OUT"], timeout=params.get("timeout", 0),
            parameters={"from": "parent"})
        if params.get("mode") == "iterate":
            return self.iterate(child, params.get("cancel", False))
        result = child.exec()
        if result.has_error():
            return pb_utils.InferenceResponse(error=result.error())
        out = pb_utils.get_output_tensor_by_name(result, "OUT").as_numpy()
        return pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", out)])

    def iterate(self, child, cancel):
        responses = child.exec(decoupled=True)
        if cancel:
            responses.cancel()
        self.sizes, error = [], None
        for response in responses:
            self.sizes.append(len(response.output_tensors()))
            error = response.error()
        return pb_utils.InferenceResponse(error=error)
"""

ASYNC_PARENT_MODEL = """
import asyncio
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    async def execute(self, requests):
        tensor = requests[0].inputs()[0]
        children = [
            pb_utils.InferenceRequest(model_name="echo", inputs=[tensor], requested_output_names=[])
            for _ in range(2)
        ]
        results = await asyncio.gather(*(child.async_exec() for child in children))
        total = sum(pb_utils.get_output_tensor_by_name(r, "OUT").as_numpy() for r in results)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", total)])]
"""


class FakeService:
    """Answers BLS children by model name; cancels like the real submit does."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.children: list[AdmittedRequest] = []
        self.parents: list[AdmittedRequest] = []  # the requests the parent model executes
        self.submitted = asyncio.Event()

    def model(self, name: str, version: int | None = None) -> Any:
        return SimpleNamespace(decoupled=name.startswith("decoupled"))

    def submit(self, request: InferenceRequest, cancellation: Cancellation,
               allow_decoupled: bool = True, internal: bool = False) -> ResponseStream:
        assert internal, "a BLS child is still admitted while the server drains"
        if request.model_name == "missing":
            raise TritiumError(ErrorCode.NOT_FOUND, "Request for unknown model: 'missing'")
        assert cancellation.loop is self.loop
        stream = ResponseStream(self.loop)
        self.children.append(AdmittedRequest(request, cancellation, stream))
        self.submitted.set()

        def on_cancel(cancellation: Cancellation) -> None:
            assert cancellation.reason is not None
            stream.close_with(InferenceResponse.failure(cancellation.reason.to_error()))

        cancellation.add_callback(on_cancel)
        self._answer(request, stream)
        return stream

    def _answer(self, request: InferenceRequest, stream: ResponseStream) -> None:
        data = next(iter(request.inputs.values())).data
        out = Tensor("OUT", next(iter(request.inputs.values())).datatype, data.shape, data)
        if request.model_name == "echo":
            stream.send_nowait(InferenceResponse(outputs=[out]))
        elif request.model_name == "decoupled_three":
            stream.send_nowait(InferenceResponse(outputs=[out], final=False))
            stream.send_nowait(InferenceResponse(outputs=[out], final=False))
            stream.send_nowait(InferenceResponse.final_flag())
        # Any other model never answers: only a cancellation ends it.


def parent_request(**parameters: Any) -> InferenceRequest:
    request = fp32_request([1.0, 2.0])
    request.parameters = parameters
    return request


def run_parent(tmp_path: Path, source: str, request: InferenceRequest) -> tuple[Any, Any]:
    async def main() -> tuple[Any, Any]:
        service = FakeService(asyncio.get_running_loop())
        backend = make_backend(write_model(tmp_path, "parent", source), service)
        service.parents = admit_all([request])
        await start(backend, service.parents)
        return backend, (service, await collect(service.parents[0].stream))

    return asyncio.run(main())


def test_exec_runs_child_through_service(tmp_path: Path) -> None:
    request = parent_request(target="echo", timeout=250)
    _, (service, responses) = run_parent(tmp_path, PARENT_MODEL, request)
    assert responses[0].error is None
    np.testing.assert_array_equal(responses[0].outputs[0].data, [1.0, 2.0])
    [admitted] = service.children
    child = admitted.request
    assert child.model_name == "echo" and child.model_version is None
    assert child.requested_output_names() == ["OUT"]
    assert (child.timeout_us, child.parameters) == (250, {"from": "parent"})
    assert child.inputs["INPUT0"].data is request.inputs["INPUT0"].data, "no copy"
    assert admitted.cancellation is not service.parents[0].cancellation


def test_exec_error_comes_back_in_the_response(tmp_path: Path) -> None:
    _, (_, responses) = run_parent(tmp_path, PARENT_MODEL, parent_request(target="missing"))
    error = single_error(responses)
    assert error.code is ErrorCode.NOT_FOUND and "missing" in error.message


def test_exec_of_decoupled_model_needs_decoupled_flag(tmp_path: Path) -> None:
    request = parent_request(target="decoupled_three")
    _, (_, responses) = run_parent(tmp_path, PARENT_MODEL, request)
    assert "decoupled=True" in single_error(responses).message


def test_decoupled_iterator_yields_empty_final(tmp_path: Path) -> None:
    request = parent_request(target="decoupled_three", mode="iterate")
    backend, (_, responses) = run_parent(tmp_path, PARENT_MODEL, request)
    assert responses[0].error is None
    assert backend.model.sizes == [1, 1, 0]


def test_iterator_cancel_cancels_child(tmp_path: Path) -> None:
    request = parent_request(target="hang", mode="iterate", cancel=True)
    backend, (service, responses) = run_parent(tmp_path, PARENT_MODEL, request)
    assert service.children[0].cancellation.reason is CancelReason.CLIENT_CANCELLED
    assert single_error(responses).code is ErrorCode.CANCELLED
    assert backend.model.sizes == [0]


def test_parent_cancel_reaches_blocked_child(tmp_path: Path) -> None:
    request = parent_request(target="hang")

    async def main() -> list[InferenceResponse]:
        service = FakeService(asyncio.get_running_loop())
        backend = make_backend(write_model(tmp_path, "parent", PARENT_MODEL), service)
        [parent] = admit_all([request])
        running = asyncio.ensure_future(start(backend, [parent]))
        async with asyncio.timeout(WAIT_S):
            await service.submitted.wait()
        parent.cancellation.cancel(CancelReason.CLIENT_DISCONNECTED)
        async with asyncio.timeout(WAIT_S):
            await running
        assert service.children[0].cancellation.reason is CancelReason.PARENT_CANCELLED
        return await collect(parent.stream)

    responses = asyncio.run(main())
    error = single_error(responses)
    assert error.code is ErrorCode.CANCELLED and "parent" in error.message


def test_async_exec_from_async_execute(tmp_path: Path) -> None:
    _, (service, responses) = run_parent(tmp_path, ASYNC_PARENT_MODEL, fp32_request([1.0, 2.0]))
    np.testing.assert_array_equal(responses[0].outputs[0].data, [2.0, 4.0])
    assert len(service.children) == 2
    assert all(child.request.requested_outputs is None for child in service.children)


def on_a_loop(scenario: Callable[[asyncio.AbstractEventLoop], None]) -> None:
    async def main() -> None:
        scenario(asyncio.get_running_loop())

    asyncio.run(main())


def test_child_of_a_batch_waits_for_every_parent() -> None:
    def scenario(loop: asyncio.AbstractEventLoop) -> None:
        parents = [Cancellation(loop), Cancellation(loop)]
        child = Cancellation.following(loop, parents, CancelReason.PARENT_CANCELLED)
        parents[0].cancel(CancelReason.CLIENT_CANCELLED)
        assert not child.is_cancelled()
        parents[1].cancel(CancelReason.DEADLINE)
        assert child.reason is CancelReason.PARENT_CANCELLED
        child.detach()

    on_a_loop(scenario)


def test_detached_child_no_longer_follows() -> None:
    def scenario(loop: asyncio.AbstractEventLoop) -> None:
        parent = Cancellation(loop)
        child = Cancellation.following(loop, [parent], CancelReason.PARENT_CANCELLED)
        child.detach()
        parent.cancel(CancelReason.CLIENT_CANCELLED)
        assert not child.is_cancelled()

    on_a_loop(scenario)


def test_already_cancelled_parent_cancels_child_at_once() -> None:
    def scenario(loop: asyncio.AbstractEventLoop) -> None:
        parent = Cancellation(loop)
        parent.cancel(CancelReason.CLIENT_CANCELLED)
        child = Cancellation.following(loop, [parent], CancelReason.PARENT_CANCELLED)
        assert child.reason is CancelReason.PARENT_CANCELLED

    on_a_loop(scenario)


ASYNC_DECOUPLED_PARENT_MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    async def execute(self, requests):
        tensor = requests[0].inputs()[0]
        child = pb_utils.InferenceRequest(
            model_name="decoupled_three", inputs=[tensor], requested_output_names=[])
        future = child.async_exec(decoupled=True)
        self.done_at_once = future.done()
        responses = await future
        self.sizes = [len(r.output_tensors()) async for r in responses]
        self.replayed = [len(r.output_tensors()) for r in responses]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", tensor.as_numpy())])]
"""


def test_async_decoupled_exec_is_awaited_and_iterated_without_blocking(tmp_path: Path) -> None:
    """As Triton's (run in an executor), the future is pending until the child's first
    response; ``async for`` reads the rest, and a plain ``for`` then replays them."""
    backend, (_, responses) = run_parent(tmp_path, ASYNC_DECOUPLED_PARENT_MODEL,
                                         fp32_request([1.0, 2.0]))
    assert responses[0].error is None
    assert backend.model.done_at_once is False
    assert backend.model.sizes == [1, 1, 0]
    assert backend.model.replayed == [1, 1, 0]
