"""AdmittedRequest: stage moves only along the table; the decoded request stays the caller's."""

from __future__ import annotations

import pytest

from tests.unit.admitted import admit
from tritium.core.request import AdmittedRequest, InferenceRequest, RequestStage, StageError

CREATED, QUEUED, EXECUTING, DONE = (RequestStage.CREATED, RequestStage.QUEUED,
                                    RequestStage.EXECUTING, RequestStage.DONE)


def admitted() -> AdmittedRequest:
    return admit(InferenceRequest(model_name="m", inputs={}, id="r1"))


@pytest.mark.parametrize("path", [
    [QUEUED, EXECUTING, DONE],  # ran
    [QUEUED, DONE],  # cancelled in the queue
    [QUEUED, EXECUTING, QUEUED, EXECUTING, DONE],  # rescheduled by its model, then ran
])
def test_legal_paths(path: list[RequestStage]) -> None:
    request = admitted()
    assert request.stage is CREATED
    for stage in path:
        request.move_to(stage)
        assert request.stage is stage


@pytest.mark.parametrize(("before", "after"), [
    ([], EXECUTING),  # dispatched without being queued
    ([], DONE),
    ([QUEUED], QUEUED),  # queued twice
    ([QUEUED], CREATED),
    ([QUEUED, EXECUTING], EXECUTING),
    ([QUEUED, DONE], EXECUTING),  # a cancelled request run after all
    ([QUEUED, DONE], DONE),
])
def test_illegal_moves_raise_and_change_nothing(before: list[RequestStage],
                                                after: RequestStage) -> None:
    request = admitted()
    for stage in before:
        request.move_to(stage)
    current = request.stage
    with pytest.raises(StageError, match="r1"):
        request.move_to(after)
    assert request.stage is current


def test_stage_is_not_assignable() -> None:
    request = admitted()
    with pytest.raises(AttributeError):
        request.stage = DONE  # type: ignore[misc]
    assert request.stage is CREATED


def test_admission_keeps_the_decoded_request_and_names_it() -> None:
    decoded = InferenceRequest(model_name="m", inputs={}, id="r7", priority=2)
    request = admit(decoded, batch_size=4, arrival_ns=123)
    assert request.request is decoded
    assert (request.batch_size, request.arrival_ns) == (4, 123)
    assert request.describe() == "r7"
    assert not hasattr(decoded, "stage") and not hasattr(decoded, "cancellation")
