"""Per-name locks: one holder at a time per name, and nothing kept for names not in use."""

from __future__ import annotations

import asyncio

from tritium.repository.locks import NameLocks


def test_one_holder_per_name_and_nothing_left_after() -> None:
    async def main() -> None:
        locks = NameLocks()
        order: list[str] = []
        first_in = asyncio.Event()
        release = asyncio.Event()

        async def first() -> None:
            async with locks.hold("m"):
                order.append("first in")
                first_in.set()
                await release.wait()
                order.append("first out")

        async def second() -> None:
            await first_in.wait()
            async with locks.hold("m"):
                order.append("second in")

        async def other() -> None:
            await first_in.wait()
            async with locks.hold("other"):  # another name does not wait
                order.append("other in")
            release.set()

        await asyncio.gather(first(), second(), other())
        assert order == ["first in", "other in", "first out", "second in"]
        assert len(locks) == 0

    asyncio.run(main())


def test_a_failing_holder_releases_and_forgets_the_name() -> None:
    async def main() -> None:
        locks = NameLocks()
        for index in range(1000):
            try:
                async with locks.hold(f"name{index}"):
                    raise ValueError("refused")
            except ValueError:
                pass
        assert len(locks) == 0

    asyncio.run(main())
