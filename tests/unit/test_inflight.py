"""InFlight: membership and the wait for it to empty."""

from __future__ import annotations

import asyncio

from tritium.core.inflight import InFlight


def test_wait_empty_returns_at_once_when_empty() -> None:
    async def main() -> None:
        await asyncio.wait_for(InFlight[int]().wait_empty(), 1)

    asyncio.run(main())


def test_wait_empty_wakes_when_the_last_member_leaves() -> None:
    async def main() -> None:
        members = InFlight[str]()
        members.add("a")
        members.add("b")
        waiter = asyncio.ensure_future(members.wait_empty())
        await asyncio.sleep(0)
        members.discard("a")
        await asyncio.sleep(0)
        assert not waiter.done()
        members.discard("b")
        await asyncio.wait_for(waiter, 1)
        assert not members and len(members) == 0

    asyncio.run(main())


def test_discarding_an_absent_member_is_harmless_and_iteration_is_a_snapshot() -> None:
    members = InFlight[int]()
    members.discard(7)
    for n in (1, 2, 3):
        members.add(n)
    for n in members:
        members.discard(n)
    assert 1 not in members and list(members) == []


def test_members_keep_the_order_they_were_added_in_and_adding_twice_keeps_one() -> None:
    members = InFlight[str]()
    for name in ("b", "a", "c", "a"):
        members.add(name)
    assert list(members) == ["b", "a", "c"] and len(members) == 3
    members.discard("a")
    members.add("a")
    assert list(members) == ["b", "c", "a"]


def test_left_after_returns_what_did_not_finish_in_time_and_nothing_once_empty() -> None:
    async def main() -> None:
        members = InFlight[str]()
        members.add("stuck")
        members.add("quick")
        asyncio.get_running_loop().call_later(0.01, members.discard, "quick")
        assert await members.left_after(0.2) == ["stuck"]
        members.discard("stuck")
        assert await members.left_after(5) == []

    asyncio.run(main())
