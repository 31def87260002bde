"""The batch runner both instance kinds use: where results go is all that differs."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.unit.admitted import admit
from tritium.core.errors import ErrorCode
from tritium.core.request import AdmittedRequest, InferenceRequest
from tritium.execution.placement import ThreadPlacement
from tritium.execution.runner import BatchRunner


class Backend:
    def __init__(self, execute: Any, decoupled: bool = False) -> None:
        self.execute = execute
        self.decoupled = decoupled

    def finalize(self) -> None:
        pass


def _requests(loop: asyncio.AbstractEventLoop, count: int = 2) -> list[AdmittedRequest]:
    return [admit(InferenceRequest(model_name="m", inputs={}, id=str(i)), loop=loop)
            for i in range(count)]


def test_a_sync_execute_is_reported_with_its_time() -> None:
    async def main() -> None:
        reports: list[tuple[str, int]] = []
        runner: BatchRunner[str] = BatchRunner(Backend(lambda requests: None), "m",
                             lambda token, ns, woken: reports.append((token, ns)),
                             ThreadPlacement())
        runner.run("batch", _requests(asyncio.get_running_loop()))
        runner.run("empty", [])
        assert reports[0][0] == "batch" and reports[0][1] >= 0
        assert reports[1] == ("empty", -1)  # nothing ran
    asyncio.run(main())


def test_an_exception_answers_every_open_request_in_tritons_words() -> None:
    async def main() -> None:
        def execute(requests: list[AdmittedRequest]) -> None:
            raise RuntimeError("boom")

        requests = _requests(asyncio.get_running_loop())
        runner: BatchRunner[int] = BatchRunner(Backend(execute), "m", lambda *a: None,
                                               ThreadPlacement())
        runner.run(1, requests)
        for request in requests:
            error = request.stream._items[0].error
            assert error is not None and error.code is ErrorCode.INTERNAL
            assert error.message == ("Failed to process the request(s) for model 'm', "
                                     "message: boom")
    asyncio.run(main())


def test_a_decoupled_coroutine_is_reported_at_once_and_overlaps() -> None:
    async def main() -> None:
        gate = asyncio.Event()
        reports: list[int] = []

        async def execute(requests: list[AdmittedRequest]) -> None:
            await gate.wait()

        for decoupled, before_gate in ((True, 1), (False, 0)):
            reports.clear()
            runner: BatchRunner[int] = BatchRunner(Backend(execute, decoupled), "m",
                                 lambda token, ns, woken: reports.append(token),
                                 ThreadPlacement())
            runner.start_async(7, _requests(asyncio.get_running_loop(), 1))
            await asyncio.sleep(0)
            assert len(reports) == before_gate
            gate.set()
            await asyncio.sleep(0.01)
            assert reports == [7]
            gate.clear()
    asyncio.run(main())
