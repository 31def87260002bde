"""EnsembleModel over a real InferenceService whose composing models the test answers by
hand: when steps start, what a failure or a cancellation does to the others, the final
response's shape, and the ensemble's own statistics."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tritium.core.cancellation import Cancellation, CancelReason
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.request import AdmittedRequest, InferenceRequest, RequestStage
from tritium.core.response import InferenceResponse, ResponseStream, ServedBy
from tritium.core.service import InferenceService
from tritium.core.types import DataType, Tensor, TensorSpec
from tritium.ensemble.handle import EnsembleModel
from tritium.ensemble.plan import EnsemblePlan

FP32 = {"INPUT0": TensorSpec("INPUT0", DataType.FP32, (-1,))}
OUT = {"OUTPUT0": TensorSpec("OUTPUT0", DataType.FP32, (-1,))}


class Step:
    """A composing model whose requests wait until the test answers them."""

    max_batch_size = 0
    inputs = FP32
    outputs = OUT

    def __init__(self, name: str, decoupled: bool = False):
        self.name, self.version, self.decoupled = name, 1, decoupled
        self.served_by = ServedBy(name, 1, False, {})
        self.requests: list[AdmittedRequest] = []
        self.cancelled: list[AdmittedRequest] = []
        self.ready = True

    def is_ready(self) -> bool:
        return self.ready

    def enqueue(self, request: AdmittedRequest) -> None:
        request.move_to(RequestStage.QUEUED)
        self.requests.append(request)

    def request_cancelled(self, request: AdmittedRequest) -> None:
        self.cancelled.append(request)

    def request_finished(self, request: AdmittedRequest, error: TritiumError | None) -> None:
        if request.stage is not RequestStage.DONE:
            request.move_to(RequestStage.DONE)

    def answer(self, index: int = -1, value: float | None = None, final: bool = True) -> None:
        request = self.requests[index]
        data = request.request.inputs["INPUT0"].data if value is None else np.array(
            [value], np.float32)
        request.stream.send_nowait(InferenceResponse(
            outputs=[Tensor("OUTPUT0", DataType.FP32, tuple(data.shape), data)], final=final))


class Repository:
    def __init__(self, *models: Any):
        self.models = {model.name: model for model in models}

    def resolve(self, name: str, version: int | None) -> Any:
        if name not in self.models:
            raise TritiumError(ErrorCode.INVALID_ARG, f"Request for unknown model: '{name}'")
        return self.models[name]

    resolve_member = resolve


def serve(repository: Repository, loop: asyncio.AbstractEventLoop) -> InferenceService:
    # Only ``resolve`` of the ModelRepository protocol is used by what these tests do.
    return InferenceService(repository, loop)  # type: ignore[arg-type]


def ensemble(service: InferenceService, name: str, steps: str, outputs: str = "OUTPUT0",
             max_inflight: int = 0) -> EnsembleModel:
    text = (f'name: "{name}" platform: "ensemble" '
            'input { name: "INPUT0" data_type: TYPE_FP32 dims: [-1] } '
            + "".join(f'output {{ name: "{o}" data_type: TYPE_FP32 dims: [-1] }} '
                      for o in outputs.split())
            + f"ensemble_scheduling {{ {steps} max_inflight_requests: {max_inflight} }}")
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    return EnsembleModel(EnsemblePlan.from_config(config), config, service)


def step(model: str, source: str, target: str) -> str:
    return (f'step {{ model_name: "{model}" model_version: -1 '
            f'input_map {{ key: "INPUT0" value: "{source}" }} '
            f'output_map {{ key: "OUTPUT0" value: "{target}" }} }} ')


CHAIN = step("a", "INPUT0", "t") + step("b", "t", "OUTPUT0")
FORK = step("a", "INPUT0", "OA") + step("b", "INPUT0", "OB")


def run(body: Callable[[asyncio.AbstractEventLoop], Awaitable[None]]) -> None:
    async def main() -> None:
        await asyncio.wait_for(body(asyncio.get_running_loop()), 10)
    asyncio.run(main())


def submit(service: InferenceService, model: str, cancellation: Cancellation) -> ResponseStream:
    data = np.array([1.0, 2.0], np.float32)
    request = InferenceRequest(model, {"INPUT0": Tensor("INPUT0", DataType.FP32, (2,), data)},
                               id="r1", parameters={"p": 1}, priority=2, timeout_us=5)
    return service.submit(request, cancellation)


async def turn() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


def test_steps_start_in_order_and_carry_the_requests_fields() -> None:
    async def body(loop: asyncio.AbstractEventLoop) -> None:
        a, b = Step("a"), Step("b")
        repository = Repository(a, b)
        service = serve(repository, loop)
        repository.models["chain"] = model = ensemble(service, "chain", CHAIN)
        stream = submit(service, "chain", Cancellation(loop))
        await turn()
        assert len(a.requests) == 1 and b.requests == []
        child = a.requests[0].request
        assert (child.id, child.parameters, child.priority, child.timeout_us) == (
            "r1", {"p": 1}, 2, 5)
        assert child.requested_output_names() == ["OUTPUT0"]
        a.answer()
        await turn()
        assert len(b.requests) == 1
        b.answer(value=7.0)
        response = await stream.receive()
        assert response.final and response.error is None
        assert [t.name for t in response.outputs] == ["OUTPUT0"]
        assert response.outputs[0].data.tolist() == [7.0]
        assert response.served_by is model.served_by
        await turn()
        assert model.statistics().success.count == 1 and model.in_flight() == 0
    run(body)


def test_a_failing_step_is_answered_once_the_running_steps_finished() -> None:
    """Triton's EnsembleContext::FinishEnsemble sends a step's error only once no step is in
    flight; the running sibling is not stopped and its outputs are dropped."""
    async def body(loop: asyncio.AbstractEventLoop) -> None:
        a, b = Step("a"), Step("b")
        repository = Repository(a, b)
        service = serve(repository, loop)
        repository.models["fork"] = model = ensemble(service, "fork", FORK, "OA OB")
        stream = submit(service, "fork", Cancellation(loop))
        await turn()
        a.requests[0].stream.send_nowait(InferenceResponse.failure(
            TritiumError(ErrorCode.INTERNAL, "boom")))
        await turn()
        assert stream.receive_nowait() is None  # b still runs
        sibling = b.requests[0].cancellation
        assert sibling.reason is None
        b.answer()
        response = await stream.receive()
        assert response.final and response.error is not None
        assert response.error.message == "in ensemble 'fork', boom"
        await turn()
        assert model.statistics().failures["OTHER"] == 1
    run(body)


def test_leaving_while_a_failed_run_waits_stops_the_running_steps() -> None:
    async def body(loop: asyncio.AbstractEventLoop) -> None:
        a, b = Step("a"), Step("b")
        repository = Repository(a, b)
        service = serve(repository, loop)
        repository.models["fork"] = ensemble(service, "fork", FORK, "OA OB")
        client = Cancellation(loop)
        stream = submit(service, "fork", client)
        await turn()
        a.requests[0].stream.send_nowait(InferenceResponse.failure(
            TritiumError(ErrorCode.INTERNAL, "boom")))
        await turn()
        client.cancel(CancelReason.CLIENT_DISCONNECTED)
        response = await stream.receive()
        assert response.error is not None and response.error.code is ErrorCode.CANCELLED
        assert b.requests[0].cancellation.reason is CancelReason.CLIENT_DISCONNECTED
    run(body)


def test_a_cancelled_ensemble_cancels_its_step_and_starts_no_other() -> None:
    async def body(loop: asyncio.AbstractEventLoop) -> None:
        a, b = Step("a"), Step("b")
        repository = Repository(a, b)
        service = serve(repository, loop)
        repository.models["chain"] = model = ensemble(service, "chain", CHAIN)
        client = Cancellation(loop)
        stream = submit(service, "chain", client)
        await turn()
        client.cancel(CancelReason.CLIENT_DISCONNECTED)
        response = await stream.receive()
        assert response.error is not None and response.error.code is ErrorCode.CANCELLED
        assert a.requests[0].cancellation.reason is CancelReason.CLIENT_DISCONNECTED
        assert a.cancelled == [a.requests[0]]
        a.answer()  # the step answers anyway: nothing follows it
        await turn()
        assert b.requests == []
        stats = model.statistics()
        assert stats.cancellations[("CLIENT_DISCONNECTED", "executing")] == 1
        assert stats.failures["CANCELED"] == 1
    run(body)


def test_a_decoupled_step_flows_through_and_the_last_response_is_final() -> None:
    async def body(loop: asyncio.AbstractEventLoop) -> None:
        a, b = Step("a", decoupled=True), Step("b")
        repository = Repository(a, b)
        service = serve(repository, loop)
        repository.models["chain"] = model = ensemble(service, "chain", CHAIN)
        assert model.decoupled  # Triton's rule: any decoupled step
        stream = submit(service, "chain", Cancellation(loop))
        await turn()
        for value in (1.0, 2.0):
            a.answer(value=value, final=False)
        await turn()
        assert len(b.requests) == 2  # one per response, both running at once
        b.answer(0)
        first = await stream.receive()
        assert first.outputs[0].data.tolist() == [1.0] and not first.final
        a.requests[0].stream.send_nowait(InferenceResponse.final_flag())
        b.answer(1)
        second = await stream.receive()
        assert second.outputs[0].data.tolist() == [2.0] and second.final
    run(body)


def test_a_decoupled_ensemble_with_no_response_ends_with_a_final_flag() -> None:
    async def body(loop: asyncio.AbstractEventLoop) -> None:
        a, b = Step("a", decoupled=True), Step("b")
        repository = Repository(a, b)
        service = serve(repository, loop)
        repository.models["chain"] = ensemble(service, "chain", CHAIN)
        stream = submit(service, "chain", Cancellation(loop))
        await turn()
        a.requests[0].stream.send_nowait(InferenceResponse.final_flag())
        response = await stream.receive()
        assert response.final and response.flag_only and b.requests == []
    run(body)


def test_a_single_response_ensemble_without_its_outputs_is_a_deadlock() -> None:
    """Triton: "unexpected deadlock, at least one output is not set while no more ensemble
    steps can be made" when a non-decoupled ensemble ends without an answer."""
    async def body(loop: asyncio.AbstractEventLoop) -> None:
        a, b = Step("a"), Step("b")
        repository = Repository(a, b)
        service = serve(repository, loop)
        repository.models["chain"] = ensemble(service, "chain", CHAIN)
        stream = submit(service, "chain", Cancellation(loop))
        await turn()
        a.requests[0].stream.send_nowait(InferenceResponse.final_flag())
        response = await stream.receive()
        assert response.error is not None and response.error.code is ErrorCode.INVALID_ARG
        assert response.error.message == (
            "in ensemble 'chain', [request id: r1] unexpected deadlock, at least one output "
            "is not set while no more ensemble steps can be made")
    run(body)


def test_a_step_refused_at_once_still_finishes_the_request() -> None:
    async def body(loop: asyncio.AbstractEventLoop) -> None:
        repository = Repository(Step("a"))  # "b" is missing
        service = serve(repository, loop)
        repository.models["odd"] = model = ensemble(service, "odd", step("b", "INPUT0",
                                                                          "OUTPUT0"))
        stream = submit(service, "odd", Cancellation(loop))
        response = await stream.receive()
        assert response.error is not None
        assert response.error.message == "in ensemble 'odd', Request for unknown model: 'b'"
        await turn()
        assert model.in_flight() == 0 and service.in_flight() == []
    run(body)


def test_max_inflight_requests_holds_a_step_back_until_one_finishes() -> None:
    """Triton's per-step limit, shared by the ensemble's requests; a request cancelled while
    its step waits for a slot never reaches the step's model."""
    async def body(loop: asyncio.AbstractEventLoop) -> None:
        a = Step("a")
        repository = Repository(a)
        service = serve(repository, loop)
        repository.models["one"] = ensemble(service, "one", step("a", "INPUT0", "OUTPUT0"),
                                            max_inflight=1)
        first = submit(service, "one", Cancellation(loop))
        second = submit(service, "one", Cancellation(loop))
        leaving = Cancellation(loop)
        third = submit(service, "one", leaving)
        await turn()
        assert len(a.requests) == 1
        leaving.cancel(CancelReason.CLIENT_CANCELLED)
        assert (await third.receive()).error is not None
        a.answer(0)
        assert (await first.receive()).error is None
        await turn()
        assert len(a.requests) == 2  # the second now; the third is gone
        a.answer(1)
        assert (await second.receive()).error is None
        await turn()
        assert len(a.requests) == 2
    run(body)


def test_an_ensemble_is_ready_only_while_every_composing_model_is() -> None:
    """A composing model that is not ready (an instance process restarting) makes the
    ensemble not ready: a request to it now would wait or fail in that step."""
    async def body(loop: asyncio.AbstractEventLoop) -> None:
        a, b = Step("a"), Step("b")
        handle = ensemble(serve(Repository(a, b), loop), "e", CHAIN)
        assert handle.is_ready()
        b.ready = False
        assert not handle.is_ready()
        b.ready = True
        await handle.stop()
        assert not handle.is_ready()

    run(body)

