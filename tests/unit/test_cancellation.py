"""Cancellation: set once, first reason wins, callbacks once on the loop, children follow."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from tritium.core.cancellation import Cancellation, CancelReason, running_loop
from tritium.core.errors import ErrorCode

Loop = asyncio.AbstractEventLoop


def on_a_loop(scenario: Callable[[Loop], None]) -> None:
    """Run ``scenario`` on a running loop: where callbacks run at once."""
    async def main() -> None:
        scenario(asyncio.get_running_loop())

    asyncio.run(main())


def test_first_reason_wins_and_is_never_cleared() -> None:
    def scenario(loop: Loop) -> None:
        c = Cancellation(loop)
        assert not c.is_cancelled()
        assert c.cancel(CancelReason.DEADLINE)
        assert not c.cancel(CancelReason.CLIENT_DISCONNECTED)
        assert c.is_cancelled()
        assert c.reason is CancelReason.DEADLINE
        assert c.cancelled_at_ns > 0

    on_a_loop(scenario)


def test_callbacks_run_once_in_order() -> None:
    def scenario(loop: Loop) -> None:
        c = Cancellation(loop)
        seen: list[str] = []
        c.add_callback(lambda _: seen.append("a"))
        c.add_callback(lambda _: seen.append("b"))
        c.cancel(CancelReason.CLIENT_CANCELLED)
        c.cancel(CancelReason.CLIENT_CANCELLED)
        assert seen == ["a", "b"]

    on_a_loop(scenario)


def test_callback_added_after_cancel_runs_at_once() -> None:
    def scenario(loop: Loop) -> None:
        c = Cancellation(loop)
        c.cancel(CancelReason.SHUTDOWN)
        seen: list[CancelReason | None] = []
        c.add_callback(lambda cancellation: seen.append(cancellation.reason))
        assert seen == [CancelReason.SHUTDOWN]

    on_a_loop(scenario)


def test_removed_callback_does_not_run() -> None:
    def scenario(loop: Loop) -> None:
        c = Cancellation(loop)
        seen: list[int] = []

        def callback(_: Cancellation) -> None:
            seen.append(1)

        c.add_callback(callback)
        c.remove_callback(callback)
        c.cancel(CancelReason.CLIENT_CANCELLED)
        assert seen == []

    on_a_loop(scenario)


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


def test_callbacks_of_a_cancel_off_the_loop_never_run_on_the_calling_thread() -> None:
    loop = asyncio.new_event_loop()
    try:
        c = Cancellation(loop)
        seen: list[threading.Thread] = []
        c.add_callback(lambda _: seen.append(threading.current_thread()))
        c.cancel(CancelReason.CLIENT_CANCELLED)  # no loop runs on this thread
        assert seen == []
        loop.run_until_complete(asyncio.sleep(0))
        assert seen == [threading.main_thread()]
    finally:
        loop.close()


# -- one child --------------------------------------------------------------------
def test_child_follows_parent_with_parent_reason() -> None:
    def scenario(loop: Loop) -> None:
        parent = Cancellation(loop)
        child = parent.child()
        assert child.loop is loop
        parent.cancel(CancelReason.CLIENT_DISCONNECTED)
        assert child.reason is CancelReason.CLIENT_DISCONNECTED

    on_a_loop(scenario)


def test_child_takes_the_reason_it_was_given() -> None:
    def scenario(loop: Loop) -> None:
        parent = Cancellation(loop)
        child = parent.child(CancelReason.PARENT_CANCELLED)
        parent.cancel(CancelReason.CLIENT_DISCONNECTED)
        assert child.reason is CancelReason.PARENT_CANCELLED

    on_a_loop(scenario)


def test_child_cancelled_alone_leaves_parent_and_siblings_be() -> None:
    def scenario(loop: Loop) -> None:
        parent = Cancellation(loop)
        first, second = parent.child(), parent.child()
        assert first.cancel(CancelReason.CLIENT_CANCELLED)
        assert not parent.is_cancelled() and not second.is_cancelled()
        parent.cancel(CancelReason.SHUTDOWN)
        assert first.reason is CancelReason.CLIENT_CANCELLED
        assert second.reason is CancelReason.SHUTDOWN

    on_a_loop(scenario)


def test_child_of_a_cancelled_parent_starts_cancelled() -> None:
    def scenario(loop: Loop) -> None:
        parent = Cancellation(loop)
        parent.cancel(CancelReason.DEADLINE)
        assert parent.child().reason is CancelReason.DEADLINE

    on_a_loop(scenario)


def test_finished_children_leave_no_callback_on_the_parent() -> None:
    def scenario(loop: Loop) -> None:
        parent = Cancellation(loop)
        detached, cancelled = parent.child(), parent.child()
        detached.detach()
        detached.detach()  # idempotent
        cancelled.cancel(CancelReason.CLIENT_CANCELLED)
        assert parent._callbacks == []
        parent.cancel(CancelReason.SHUTDOWN)
        assert not detached.is_cancelled()

    on_a_loop(scenario)


def test_a_finished_request_drops_its_callback_and_its_parents() -> None:
    """What the service does when a request's final response is sent."""
    def scenario(loop: Loop) -> None:
        parent = Cancellation(loop)
        child = parent.child()
        seen: list[object] = []

        def kept(c: Cancellation) -> None:
            seen.append(c.reason)

        child.add_callback(seen.append)
        child.add_callback(kept)
        child.remove_callback(kept)
        child.detach()
        assert parent._callbacks == []  # it follows its parent no more
        parent.cancel(CancelReason.SHUTDOWN)
        assert not child.is_cancelled()
        child.cancel(CancelReason.CLIENT_CANCELLED)
        assert seen == [child]  # the other callback still runs, the removed one not

    on_a_loop(scenario)


def test_grandchild_follows_through_its_parent() -> None:
    def scenario(loop: Loop) -> None:
        root = Cancellation(loop)
        grandchild = root.child().child()
        root.cancel(CancelReason.CLIENT_DISCONNECTED)
        assert grandchild.reason is CancelReason.CLIENT_DISCONNECTED

    on_a_loop(scenario)


def test_parent_cancelled_on_another_thread_reaches_child_on_the_loop() -> None:
    async def scenario() -> None:
        parent = Cancellation(asyncio.get_running_loop())
        child = parent.child()
        reached = asyncio.Event()
        child.add_callback(lambda _: reached.set())
        thread = threading.Thread(target=parent.cancel, args=(CancelReason.CLIENT_CANCELLED,))
        thread.start()
        thread.join()
        await asyncio.wait_for(reached.wait(), 5)
        assert child.reason is CancelReason.CLIENT_CANCELLED

    asyncio.run(scenario())


# -- several parents ----------------------------------------------------------------
def test_following_several_parents_waits_for_all_of_them() -> None:
    def scenario(loop: Loop) -> None:
        parents = [Cancellation(loop) for _ in range(3)]
        child = Cancellation.following(loop, parents, CancelReason.PARENT_CANCELLED)
        parents[0].cancel(CancelReason.CLIENT_CANCELLED)
        parents[2].cancel(CancelReason.DEADLINE)
        assert not child.is_cancelled()
        parents[1].cancel(CancelReason.CLIENT_DISCONNECTED)
        assert child.reason is CancelReason.PARENT_CANCELLED
        assert all(not parent._callbacks for parent in parents)

    on_a_loop(scenario)


def test_following_without_a_reason_takes_the_last_parents() -> None:
    def scenario(loop: Loop) -> None:
        parents = [Cancellation(loop), Cancellation(loop)]
        child = Cancellation.following(loop, parents)
        parents[1].cancel(CancelReason.CLIENT_CANCELLED)
        parents[0].cancel(CancelReason.DEADLINE)
        assert child.reason is CancelReason.DEADLINE

    on_a_loop(scenario)


def test_following_no_parents_follows_nothing() -> None:
    def scenario(loop: Loop) -> None:
        child = Cancellation.following(loop, [], CancelReason.PARENT_CANCELLED)
        assert child.loop is loop and not child.is_cancelled()
        child.detach()

    on_a_loop(scenario)


def test_parents_on_another_loop_are_refused() -> None:
    other = asyncio.new_event_loop()
    try:
        def scenario(loop: Loop) -> None:
            with pytest.raises(ValueError, match="event loop"):
                Cancellation.following(loop, [Cancellation(other)])

        on_a_loop(scenario)
    finally:
        other.close()


def test_reasons_map_to_client_errors() -> None:
    assert CancelReason.DEADLINE.to_error().code is ErrorCode.UNAVAILABLE
    assert "timeout" in CancelReason.DEADLINE.to_error().message
    assert CancelReason.CLIENT_CANCELLED.to_error().code is ErrorCode.CANCELLED
    assert CancelReason.SHUTDOWN.to_error().code is ErrorCode.UNAVAILABLE


def test_running_loop_is_the_threads_own_and_none_elsewhere() -> None:
    seen: list[object] = []

    def scenario(loop: Loop) -> None:
        seen.append(running_loop() is loop)
        worker = threading.Thread(target=lambda: seen.append(running_loop()))
        worker.start()
        worker.join()

    on_a_loop(scenario)
    assert seen == [True, None]
    assert running_loop() is None
