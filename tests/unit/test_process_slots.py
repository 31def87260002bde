"""A process instance's slot accounting: every slot a request takes comes back once the
request is done with it (its final response came and its execute returned, or its model
released it with RESCHEDULE), so a long-lived instance never runs out."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.unit.admitted import admit
from tritium.core.request import RELEASE_RESCHEDULE, AdmittedRequest, InferenceRequest
from tritium.execution.backend import InstanceInfo
from tritium.execution.process import messages as msg
from tritium.execution.process.flags import FlagTable
from tritium.execution.process.instance import ProcessInstance

SLOTS = 4


class Channel:
    """Keeps the EXECUTE frames the server would send to the process."""

    def __init__(self) -> None:
        self.sent: list[msg.Execute] = []

    def send(self, message: msg.Execute) -> None:
        self.sent.append(message)

    send_now = send


class Arena:
    """Tensors cross nothing here: none are sent or returned."""

    def pack(self, tensors: Any) -> msg.Packed:
        return msg.EMPTY

    def unpack(self, packed: msg.Packed) -> list[Any]:
        return []


def _instance(loop: asyncio.AbstractEventLoop) -> tuple[ProcessInstance, Channel, list[Any]]:
    info = InstanceInfo("m", 1, "/nowhere", "{}", "m_0", "CPU", 0)
    done: list[Any] = []
    instance = ProcessInstance(info, None, loop, lambda *args: done.append(args))
    channel = Channel()
    instance._channel = channel  # type: ignore[assignment]
    instance._writer = Arena()  # type: ignore[assignment]
    instance._reader = Arena()  # type: ignore[assignment]
    instance._flags.close()
    instance._flags = FlagTable(SLOTS)
    return instance, channel, done


def _request(loop: asyncio.AbstractEventLoop) -> AdmittedRequest:
    return admit(InferenceRequest(model_name="m", inputs={}), loop=loop)


def _final(slot: int) -> msg.ResponseBody:
    return msg.ResponseBody(slot, True, True)


def _run(decoupled: bool) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        instance, channel, done = _instance(loop)
        request = _request(loop)
        for _ in range(3 * SLOTS):  # far more executions than slots
            instance.submit([request])
            execute = channel.sent[-1]
            slot = execute.requests[0].slot
            rescheduled = [msg.Released(slot, RELEASE_RESCHEDULE)]
            responses = [msg.ResponseBody(slot, False, False, None, {})] if decoupled else []
            instance._on_message(msg.Done(execute.batch_id, 1, responses, rescheduled, []))
            assert instance._pending == {}, "a rescheduled request keeps its slot"
            request.release_flags = 1
        instance.submit([request])  # its last execution answers it
        execute = channel.sent[-1]
        instance._on_message(msg.Done(execute.batch_id, 1,
                                      [_final(execute.requests[0].slot)], [], []))
        assert instance._pending == {} and not instance._returned and not instance._finished
        assert len(done) == 3 * SLOTS + 1
        assert request.stream.closed
        instance._flags.close()

    asyncio.run(main())


def test_a_rescheduled_request_gives_its_slot_back_when_its_execute_returns() -> None:
    _run(decoupled=False)


def test_a_decoupled_rescheduled_request_gives_its_slot_back_too() -> None:
    """Its responses so far came in that slot; none is final, the next execution's is."""
    _run(decoupled=True)


def test_a_final_response_before_the_reschedule_release_frees_the_slot_once() -> None:
    """A decoupled model that sent its final response and still set RESCHEDULE: the slot
    comes back once, not twice (a double release would hand it to two requests)."""
    async def main() -> None:
        loop = asyncio.get_running_loop()
        instance, channel, _ = _instance(loop)
        request = _request(loop)
        instance.submit([request])
        execute = channel.sent[-1]
        slot = execute.requests[0].slot
        instance._on_message(msg.Responses([_final(slot)]))
        instance._on_message(msg.Done(execute.batch_id, 1, [],
                                      [msg.Released(slot, RELEASE_RESCHEDULE)], []))
        assert instance._pending == {}
        free = instance._flags._free
        assert sorted(free) == list(range(SLOTS)), free
        instance._flags.close()

    asyncio.run(main())
