"""ResponseStream: send from any thread, receive on the loop, FINAL closes."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.response import (
    InferenceResponse,
    ResponseStream,
    StreamClosedError,
    model_scope,
    wake_all,
    wakes,
)


def test_responses_from_a_thread_arrive_in_order() -> None:
    async def scenario() -> None:
        stream = ResponseStream(asyncio.get_running_loop())

        def produce() -> None:
            for i in range(100):
                stream.send_nowait(InferenceResponse(parameters={"i": i}, final=i == 99))

        threading.Thread(target=produce).start()
        seen = [r.parameters["i"] async for r in stream]
        assert seen == list(range(100))

    asyncio.run(scenario())


def test_send_after_final_raises() -> None:
    async def scenario() -> None:
        stream = ResponseStream(asyncio.get_running_loop())
        stream.send_nowait(InferenceResponse.final_flag())
        with pytest.raises(StreamClosedError):
            stream.send_nowait(InferenceResponse())

    asyncio.run(scenario())


def test_close_with_error_drops_later_sends_quietly() -> None:
    async def scenario() -> None:
        stream = ResponseStream(asyncio.get_running_loop())
        error = TritiumError(ErrorCode.CANCELLED, "gone")
        assert stream.close_with(InferenceResponse.failure(error))
        stream.send_nowait(InferenceResponse())  # the model does not know yet: no error
        first = await stream.receive()
        assert first.error is error and first.final
        assert stream.receive_nowait() is None

    asyncio.run(scenario())


def test_on_done_runs_once_after_final() -> None:
    async def scenario() -> None:
        stream = ResponseStream(asyncio.get_running_loop())
        calls: list[int] = []
        stream.on_done = lambda: calls.append(1)
        stream.send_nowait(InferenceResponse(final=False))
        assert calls == []
        stream.send_nowait(InferenceResponse.final_flag())
        assert calls == [1]
        late = InferenceResponse.failure(TritiumError(ErrorCode.CANCELLED, "x"))
        assert not stream.close_with(late)
        assert calls == [1]

    asyncio.run(scenario())


def test_deferred_wakes_hold_back_until_woken_and_model_code_sends_do_not() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        held, direct = ResponseStream(loop), ResponseStream(loop)
        woken: list[ResponseStream] = []

        def produce() -> None:
            streams: list[ResponseStream] = []
            wakes.deferred = streams
            try:
                held.send_nowait(InferenceResponse())
                token = model_scope.set("model code")  # what it sends itself wakes now
                try:
                    direct.send_nowait(InferenceResponse())
                finally:
                    model_scope.reset(token)
            finally:
                wakes.deferred = None
            woken.extend(streams)

        waiting = asyncio.ensure_future(held.receive())
        await asyncio.sleep(0)
        await loop.run_in_executor(None, produce)
        assert (await asyncio.wait_for(direct.receive(), 5)).final
        assert woken == [held]
        await asyncio.sleep(0.01)
        assert not waiting.done()  # nobody told the loop yet
        wake_all(woken)
        assert (await asyncio.wait_for(waiting, 5)).final

    asyncio.run(scenario())
