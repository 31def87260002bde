"""The framed channel between the server and an instance process, and its child calls."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import pytest

from tritium.execution.process.channel import (
    CALL,
    CALL_CANCEL,
    REPLY,
    REPLY_ERROR,
    ChildLink,
    FrameReader,
    ParentChannel,
    encode,
)
from tritium.execution.process.shm import ArenaReader, ArenaWriter, Mapping, create_memfd

T = TypeVar("T")


def test_frames_cut_at_any_byte_boundary() -> None:
    frames = [(1, "a", {"k": [1, 2]}), (2,), (3, b"x" * 1000)]
    data = b"".join(encode(f) for f in frames)
    for step in (1, 3, 7, len(data)):
        reader = FrameReader()
        got = []
        for at in range(0, len(data), step):
            got.extend(reader.feed(data[at:at + step]))
        assert got == frames


class _Pair:
    """A parent channel on a loop and a child link in this process, over a socketpair,
    each with arenas as an instance process has them."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        parent_sock, child_sock = socket.socketpair()
        self.frames: asyncio.Queue[tuple] = asyncio.Queue()
        self.eof = loop.create_future()
        self.parent = ParentChannel(loop, parent_sock, self.frames.put_nowait,
                                    lambda: self.eof.set_result(None))
        size = 64 << 20
        down, up = create_memfd("down", size), create_memfd("up", size)
        self.parent_writer = ArenaWriter(Mapping(down, size), ring_bytes=1 << 20)
        self.parent_reader = ArenaReader(Mapping(up, size))
        self.link = ChildLink(child_sock)
        self.link.writer = ArenaWriter(Mapping(up, size), ring_bytes=1 << 20)
        self.link.reader = ArenaReader(Mapping(down, size))
        self.link.parent_slots = lambda: [7]
        os.close(down)
        os.close(up)

    def close(self) -> None:
        self.parent.close()
        self.link.close()

    def reply(self, call_id: int, payload: object, buffers: list[bytes], final: bool) -> None:
        self.parent.send((REPLY, call_id, payload, self.parent_writer.pack_buffers(buffers),
                          final))


async def _in_thread(function: Callable[[], T]) -> T:
    return await asyncio.get_running_loop().run_in_executor(None, function)


def test_a_child_call_gets_its_replies_in_order_with_buffers() -> None:
    asyncio.run(_a_child_call_gets_its_replies_in_order_with_buffers())


async def _a_child_call_gets_its_replies_in_order_with_buffers() -> None:
    """A call made from a thread of the child streams its replies back; the buffers the
    child sent reach the server as views of shared memory."""
    pair = _Pair(asyncio.get_running_loop())
    big = np.arange(1 << 18, dtype=np.int64).tobytes()  # 2 MiB: from the large region
    call = pair.link.call("echo", {"n": 3}, [b"hello", big])
    frame = await asyncio.wait_for(pair.frames.get(), 10)
    kind, call_id, name, payload, packed, parents = frame
    assert (kind, name, payload, parents) == (CALL, "echo", {"n": 3}, [7])
    buffers = pair.parent_reader.unpack_buffers(packed)
    assert bytes(buffers[0]) == b"hello" and bytes(buffers[1]) == big
    for index in range(3):
        pair.reply(call_id, index, [bytes([index]) * 10], index == 2)
    replies = await _in_thread(lambda: list(call.replies()))
    assert [(p, bytes(b[0]), f) for p, b, f in replies] == [
        (0, b"\0" * 10, False), (1, b"\1" * 10, False), (2, b"\2" * 10, True)]
    pair.close()


def test_an_async_call_and_a_cancel() -> None:
    asyncio.run(_an_async_call_and_a_cancel())


async def _an_async_call_and_a_cancel() -> None:
    """``async_result`` works on an asyncio loop of the child while no thread reads the
    socket; ``cancel`` tells the server."""
    pair = _Pair(asyncio.get_running_loop())
    results: list[Any] = []

    def child() -> None:
        async def main() -> None:
            call = pair.link.call("slow", None)
            other = pair.link.call("other", None)
            other.cancel()
            results.append(await call.async_result())
        asyncio.run(main())

    thread = threading.Thread(target=child)
    thread.start()
    first = await asyncio.wait_for(pair.frames.get(), 10)
    second = await asyncio.wait_for(pair.frames.get(), 10)
    cancel = await asyncio.wait_for(pair.frames.get(), 10)
    assert cancel == (CALL_CANCEL, second[1])
    pair.reply(first[1], "done", [], True)
    await _in_thread(lambda: thread.join(10))
    assert results and results[0][0] == "done"
    pair.close()


def test_an_error_reply_raises_in_the_child() -> None:
    asyncio.run(_an_error_reply_raises_in_the_child())


async def _an_error_reply_raises_in_the_child() -> None:
    pair = _Pair(asyncio.get_running_loop())
    call = pair.link.call("bad", None)
    frame = await asyncio.wait_for(pair.frames.get(), 10)
    pair.parent.send((REPLY_ERROR, frame[1], ValueError("no such thing")))
    with pytest.raises(ValueError, match="no such thing"):
        await _in_thread(call.result)
    pair.close()


def test_calls_fail_when_the_server_end_closes() -> None:
    asyncio.run(_calls_fail_when_the_server_end_closes())


async def _calls_fail_when_the_server_end_closes() -> None:
    pair = _Pair(asyncio.get_running_loop())
    call = pair.link.call("never", None)
    await asyncio.wait_for(pair.frames.get(), 10)
    pair.parent.close()
    with pytest.raises(EOFError):
        await _in_thread(call.result)
    pair.close()


def test_the_parent_sees_eof_when_the_child_end_closes() -> None:
    asyncio.run(_the_parent_sees_eof_when_the_child_end_closes())


async def _the_parent_sees_eof_when_the_child_end_closes() -> None:
    pair = _Pair(asyncio.get_running_loop())
    pair.link.close()
    await asyncio.wait_for(pair.eof, 10)
    assert pair.parent.closed

