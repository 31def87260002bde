"""InferenceService.submit: what it refuses before a model sees a request; what it leaves."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tritium.core.cancellation import Cancellation, CancelReason
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.request import AdmittedRequest, InferenceRequest, RequestStage
from tritium.core.response import InferenceResponse, ServedBy
from tritium.core.service import InferenceService


class NoModels:
    """A repository that must not be asked: refusals come before any lookup."""

    def resolve(self, name: str, version: int | None) -> Any:
        raise AssertionError("submit looked a model up")


def test_cancellation_made_for_another_loop_is_refused() -> None:
    other = asyncio.new_event_loop()
    try:
        async def main() -> None:
            service = InferenceService(NoModels(), asyncio.get_running_loop())  # type: ignore[arg-type]
            request = InferenceRequest(model_name="m", inputs={})
            with pytest.raises(TritiumError) as caught:
                service.submit(request, Cancellation(other))
            assert caught.value.code is ErrorCode.INTERNAL
            assert "loop" in caught.value.message
            assert service.in_flight() == []

        asyncio.run(main())
    finally:
        other.close()


class AnswersAtOnce:
    """One model version that answers each request it admits at once."""

    name = "m"
    version = 1
    decoupled = False
    max_batch_size = 0
    inputs: dict[str, Any] = {}
    outputs: dict[str, Any] = {}
    served_by = ServedBy("m", 1, False, {})

    def resolve(self, name: str, version: int | None) -> Any:
        if name != "m":
            raise TritiumError(ErrorCode.NOT_FOUND, f"Request for unknown model: '{name}'")
        return self

    def enqueue(self, admitted: AdmittedRequest) -> None:
        admitted.move_to(RequestStage.QUEUED)
        # Later, as an instance would: the service finishes admitting first.
        asyncio.get_running_loop().call_soon(admitted.stream.send_nowait, InferenceResponse())

    def request_cancelled(self, admitted: AdmittedRequest) -> None:
        pass

    def request_finished(self, admitted: AdmittedRequest, error: TritiumError | None) -> None:
        admitted.move_to(RequestStage.DONE)


def test_finished_and_refused_requests_stop_following_their_parent() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        service = InferenceService(AnswersAtOnce(), loop)  # type: ignore[arg-type]
        parent = Cancellation(loop)
        finished, refused = parent.child(), parent.child()
        response = await service.infer(InferenceRequest(model_name="m", inputs={}), finished)
        assert response.served_by is AnswersAtOnce.served_by
        with pytest.raises(TritiumError):
            service.submit(InferenceRequest(model_name="other", inputs={}), refused)
        assert parent._callbacks == [] and service.in_flight() == []
        parent.cancel(CancelReason.CLIENT_DISCONNECTED)
        assert not finished.is_cancelled() and not refused.is_cancelled()

    asyncio.run(main())


class Holds(AnswersAtOnce):
    """A model version that queues what it admits and answers nothing by itself."""

    def __init__(self) -> None:
        self.admitted: list[AdmittedRequest] = []

    def enqueue(self, admitted: AdmittedRequest) -> None:
        admitted.move_to(RequestStage.QUEUED)
        self.admitted.append(admitted)

    def request_cancelled(self, admitted: AdmittedRequest) -> None:
        if admitted.stage is RequestStage.QUEUED:
            admitted.move_to(RequestStage.DONE)  # as the scheduler drops a queued request

    def request_finished(self, admitted: AdmittedRequest, error: TritiumError | None) -> None:
        if admitted.stage is not RequestStage.DONE:
            admitted.move_to(RequestStage.DONE)


@pytest.mark.parametrize(("internal", "executing", "kept"), [
    (True, True, True),     # a BLS child that runs: the model decides what comes next
    (True, False, False),   # a BLS child still queued never runs: it ends CANCELLED
    (False, True, False),   # a client's request: its reader is gone, it ends CANCELLED
])
def test_what_a_cancelled_request_still_delivers(internal: bool, executing: bool,
                                                 kept: bool) -> None:
    """Triton's request cancel only asks the backend to stop a running request; a
    model's own BLS child that ignores it goes on streaming to the calling model."""
    async def main() -> list[InferenceResponse]:
        loop = asyncio.get_running_loop()
        model = Holds()
        service = InferenceService(model, loop)  # type: ignore[arg-type]
        cancellation = Cancellation(loop)
        stream = service.submit(InferenceRequest(model_name="m", inputs={}), cancellation,
                                internal=internal)
        if executing:
            model.admitted[0].move_to(RequestStage.EXECUTING)
        cancellation.cancel(CancelReason.CLIENT_CANCELLED)
        await asyncio.to_thread(stream.send_nowait, InferenceResponse(final=False))
        await asyncio.to_thread(stream.send_nowait, InferenceResponse.final_flag())
        responses = [response async for response in stream]
        assert service.in_flight() == []
        return responses

    responses = asyncio.run(main())
    if kept:
        assert [(r.error, r.flag_only) for r in responses] == [(None, False), (None, True)]
    else:
        assert len(responses) == 1 and responses[0].error is not None
        assert responses[0].error.code is ErrorCode.CANCELLED


class CountsLookups(AnswersAtOnce):
    """AnswersAtOnce, counting how often the service looks a model up, and serving the
    handle ``current`` (a reload swaps it)."""

    def __init__(self) -> None:
        self.lookups = 0
        self.current: AnswersAtOnce = self

    def resolve(self, name: str, version: int | None) -> Any:
        self.lookups += 1
        super().resolve(name, version)
        return self.current


class Version2(AnswersAtOnce):
    version = 2
    served_by = ServedBy("m", 2, False, {})


def test_a_handle_resolved_in_the_same_step_is_used_as_is() -> None:
    """A frontend that looked the model up with no await since passes the handle: the
    request is not looked up a second time."""
    async def main() -> None:
        loop = asyncio.get_running_loop()
        repository = CountsLookups()
        service = InferenceService(repository, loop)  # type: ignore[arg-type]
        handle = repository.resolve("m", None)
        response = await service.infer(InferenceRequest(model_name="m", inputs={}),
                                       Cancellation(loop), handle)
        assert repository.lookups == 1 and response.served_by is AnswersAtOnce.served_by

    asyncio.run(main())


def test_a_handle_for_another_name_or_version_is_not_trusted() -> None:
    """A handle that does not match what the request asks for (a caller's mistake) is
    ignored: the request is looked up, and served by what the repository serves now."""
    async def main() -> None:
        loop = asyncio.get_running_loop()
        repository = CountsLookups()
        repository.current = Version2()
        service = InferenceService(repository, loop)  # type: ignore[arg-type]
        stale = AnswersAtOnce()  # version 1
        response = await service.infer(
            InferenceRequest(model_name="m", inputs={}, model_version=2), Cancellation(loop),
            stale)  # type: ignore[arg-type]
        assert repository.lookups == 1 and response.served_by is Version2.served_by
        other = AnswersAtOnce()
        other.name = "n"
        response = await service.infer(InferenceRequest(model_name="m", inputs={}),
                                       Cancellation(loop), other)  # type: ignore[arg-type]
        assert repository.lookups == 2 and response.served_by is Version2.served_by

    asyncio.run(main())
