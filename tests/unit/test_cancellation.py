"""Cancellation: set once, first reason wins, callbacks once on the loop."""

from __future__ import annotations

import asyncio
import threading

from tritium.core.cancellation import Cancellation, CancelReason
from tritium.core.errors import ErrorCode


def test_first_reason_wins_and_is_never_cleared() -> None:
    c = Cancellation()
    assert not c.is_cancelled()
    assert c.cancel(CancelReason.DEADLINE)
    assert not c.cancel(CancelReason.CLIENT_DISCONNECTED)
    assert c.is_cancelled()
    assert c.reason is CancelReason.DEADLINE
    assert c.cancelled_at_ns > 0


def test_callbacks_run_once_in_order() -> None:
    c = Cancellation()
    seen: list[str] = []
    c.add_callback(lambda _: seen.append("a"))
    c.add_callback(lambda _: seen.append("b"))
    c.cancel(CancelReason.CLIENT_CANCELLED)
    c.cancel(CancelReason.CLIENT_CANCELLED)
    assert seen == ["a", "b"]


def test_callback_added_after_cancel_runs_at_once() -> None:
    c = Cancellation()
    c.cancel(CancelReason.SHUTDOWN)
    seen: list[CancelReason | None] = []
    c.add_callback(lambda cancellation: seen.append(cancellation.reason))
    assert seen == [CancelReason.SHUTDOWN]


def test_removed_callback_does_not_run() -> None:
    c = Cancellation()
    seen: list[int] = []

    def callback(_: Cancellation) -> None:
        seen.append(1)

    c.add_callback(callback)
    c.remove_callback(callback)
    c.cancel(CancelReason.CLIENT_CANCELLED)
    assert seen == []


def test_cancel_from_another_thread_runs_callbacks_on_the_loop() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        c = Cancellation(loop)
        ran_on: list[threading.Thread] = []
        done = asyncio.Event()

        def callback(_: Cancellation) -> None:
            ran_on.append(threading.current_thread())
            done.set()

        c.add_callback(callback)
        thread = threading.Thread(target=c.cancel, args=(CancelReason.CLIENT_CANCELLED,))
        thread.start()
        thread.join()
        assert c.is_cancelled()  # visible at once from any thread
        await asyncio.wait_for(done.wait(), 5)
        assert ran_on == [threading.main_thread()]

    asyncio.run(scenario())


def test_child_follows_parent_with_parent_reason() -> None:
    parent, child = Cancellation(), Cancellation()
    parent.link_child(child)
    parent.cancel(CancelReason.CLIENT_DISCONNECTED)
    assert child.reason is CancelReason.PARENT_CANCELLED


def test_reasons_map_to_client_errors() -> None:
    assert CancelReason.DEADLINE.to_error().code is ErrorCode.UNAVAILABLE
    assert "timeout" in CancelReason.DEADLINE.to_error().message
    assert CancelReason.CLIENT_CANCELLED.to_error().code is ErrorCode.CANCELLED
    assert CancelReason.SHUTDOWN.to_error().code is ErrorCode.UNAVAILABLE
