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

from tritium.core.errors import TritiumError
from tritium.execution.process import channel as ch
from tritium.execution.process import messages as msg
from tritium.execution.process.channel import ChildLink, ParentChannel
from tritium.execution.process.codec import FrameReader, decode, encode
from tritium.execution.process.messages import ErrorBody
from tritium.execution.process.shm import ArenaReader, ArenaWriter, Mapping, create_memfd

T = TypeVar("T")


def test_frames_cut_at_any_byte_boundary() -> None:
    frames = [msg.Call(1, "a", {"k": [1, 2]}, msg.EMPTY, [3]), msg.Stop(),
              msg.Reply(3, b"x" * 1000, msg.EMPTY, True)]
    data = b"".join(encode(f) for f in frames)
    for step in (1, 3, 7, len(data)):
        reader = FrameReader()
        got: list[Any] = []
        for at in range(0, len(data), step):
            reader.feed(data[at:at + step])
            got.extend(decode(body) for body in reader.bodies(100))
        assert got == frames


class _Pair:
    """A parent channel on a loop and a child link in this process, over a socketpair,
    each with arenas as an instance process has them."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        parent_sock, child_sock = socket.socketpair()
        self.frames: asyncio.Queue[Any] = asyncio.Queue()
        self.eof = loop.create_future()
        self.broken: list[str] = []
        self.parent = ParentChannel(loop, parent_sock, self.frames.put_nowait,
                                    lambda: self.eof.set_result(None), self.broken.append)
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
        self.parent.send(msg.Reply(call_id, payload, self.parent_writer.pack_buffers(buffers),
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
    assert type(frame) is msg.Call
    call_id = frame.call_id
    assert (frame.kind, frame.payload, frame.parents) == ("echo", {"n": 3}, [7])
    buffers = pair.parent_reader.unpack_buffers(frame.buffers)
    assert bytes(buffers[0]) == b"hello" and bytes(buffers[1]) == big
    for index in range(3):
        pair.reply(call_id, index, [bytes([index]) * 10], index == 2)
    replies = await _in_thread(lambda: list(call.replies()))
    assert [(r.payload, bytes(r.buffers[0]), r.final) for r in replies] == [
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
    assert cancel == msg.CallCancel(second.call_id)
    pair.reply(first.call_id, "done", [], True)
    await _in_thread(lambda: thread.join(10))
    assert results and results[0].payload == "done"
    pair.close()


def test_an_error_reply_raises_in_the_child() -> None:
    asyncio.run(_an_error_reply_raises_in_the_child())


async def _an_error_reply_raises_in_the_child() -> None:
    pair = _Pair(asyncio.get_running_loop())
    call = pair.link.call("bad", None)
    frame = await asyncio.wait_for(pair.frames.get(), 10)
    pair.parent.send(msg.ReplyError(frame.call_id, ErrorBody.of(ValueError("no such thing"))))
    with pytest.raises(TritiumError, match="ValueError: no such thing"):
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



# -- a hostile child -----------------------------------------------------------------


def _hostile(send: Callable[[socket.socket], None], flood_s: float = 10.0) -> list[str]:
    """What the parent end says when its child sends what ``send`` writes raw."""
    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        parent_sock, child_sock = socket.socketpair()
        broken: list[str] = []
        done = loop.create_future()

        def on_broken(reason: str) -> None:
            broken.append(reason)
            done.set_result(None)

        ParentChannel(loop, parent_sock, lambda m: None, lambda: done.set_result(None),
                      on_broken, flood_s=flood_s)
        thread = threading.Thread(target=send, args=(child_sock,), daemon=True)
        thread.start()
        await asyncio.wait_for(done, 30)
        child_sock.close()
        return broken

    return asyncio.run(main())


def test_a_pickle_is_refused_not_run() -> None:
    import pickle

    class Boom:
        def __reduce__(self) -> Any:
            return (os.system, ("touch /tmp/tritium-pickled",))

    body = pickle.dumps((14, Boom()))
    broken = _hostile(lambda sock: sock.sendall(len(body).to_bytes(4, "little") + body))
    assert broken and broken[0].startswith("not a message")
    assert not os.path.exists("/tmp/tritium-pickled")


def test_an_oversized_frame_is_refused_before_it_is_buffered() -> None:
    broken = _hostile(lambda sock: sock.sendall(((4 << 30) - 1).to_bytes(4, "little")))
    assert broken and "over the limit" in broken[0]


def test_a_message_of_the_wrong_shape_is_refused() -> None:
    import msgspec

    body = msgspec.msgpack.encode([13, "not a batch id", 0, [], [], []])
    broken = _hostile(lambda sock: sock.sendall(len(body).to_bytes(4, "little") + body))
    assert broken and "Expected `int`, got `str`" in broken[0]


def test_a_flood_ends_the_channel_and_is_handled_in_bounded_turns() -> None:
    frame = encode(msg.CallCancel(1))

    def flood(sock: socket.socket) -> None:
        try:
            while True:
                sock.sendall(frame * 512)
        except OSError:
            pass

    broken = _hostile(flood, flood_s=0.5)
    assert broken and "flood" in broken[0]


def test_bad_arena_offsets_are_refused() -> None:
    size = 1 << 20
    fd = create_memfd("t", size)
    reader = ArenaReader(Mapping(fd, size))
    os.close(fd)
    tensor = msg.TensorDesc("x", 8, (4,), 0, 16)
    from tritium.execution.process.codec import FrameError

    for offset in (1 << 40, -64, size - 64, 3):
        with pytest.raises(FrameError):
            reader.unpack(msg.Packed(offset, [tensor]))
    with pytest.raises(FrameError):  # claims more bytes than its shape holds
        reader.unpack(msg.Packed(0, [msg.TensorDesc("x", 8, (1 << 40,), 0, 16)]))
    # The reader stays usable:
    assert reader.unpack(msg.Packed(0, [msg.TensorDesc("x", 8, (4,), 0, 16)]))


def test_a_routed_message_goes_to_its_own_handler() -> None:
    asyncio.run(_a_routed_message_goes_to_its_own_handler())


async def _a_routed_message_goes_to_its_own_handler() -> None:
    """What ``routes`` names skips ``on_message``; the rest still reaches it, in order."""
    pair = _Pair(asyncio.get_running_loop())
    routed: asyncio.Queue[Any] = asyncio.Queue()
    pair.parent.routes[msg.CallCancel] = routed.put_nowait
    call = pair.link.call("slow", None)
    call.cancel()
    first = await asyncio.wait_for(pair.frames.get(), 10)
    cancel = await asyncio.wait_for(routed.get(), 10)
    assert type(first) is msg.Call and cancel == msg.CallCancel(first.call_id)
    assert pair.frames.empty()
    pair.close()


def test_the_descriptors_an_instance_process_inherits_are_named() -> None:
    fds = {"flags": 8, "out": 7, "in": 6, "link": 5}
    value = ch.fds_value(fds)
    assert value == "link=5,in=6,out=7,flags=8"
    assert ch.parse_fds(value) == fds
    for bad in ("5,6,7,8", "link=5,in=6,out=7", "link=5,in=6,out=7,flags=8,flags=9",
                "link=5,in=6,out=x,flags=8", "link=5,in=6,up=7,flags=8"):
        with pytest.raises(ValueError, match="TRITIUM_PROCESS_FDS"):
            ch.parse_fds(bad)
