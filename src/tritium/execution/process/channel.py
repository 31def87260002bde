"""Framed messages between the server and an instance process over a Unix socketpair.

A frame is a 4-byte little-endian length and a pickled tuple ``(kind, *fields)``: small
metadata only; tensor bytes travel through the shared-memory arenas (shm.py) and a frame
names their block. The server's end is read by its event loop (``add_reader``) and never
blocks; the child's end blocks. Besides execute traffic the child can start *calls*
(BLS, metrics, logging: calls.py) and receive any number of replies to each.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import pickle
import socket
import struct
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from tritium.core.cancellation import Cancellation
from tritium.core.errors import ErrorCode, TritiumError
from tritium.execution.process.shm import EMPTY, ArenaReader, ArenaWriter, Packed

FDS_ENV = "TRITIUM_PROCESS_FDS"  # the child's descriptors: socket, arena in, arena out, flags
GONE = 0  # handed to the child's ``on_frame`` when the server's end closes
# Frame kinds, server -> child.
INIT, EXECUTE, STOP, REPLY, REPLY_ERROR = 1, 2, 3, 4, 5
# Frame kinds, child -> server.
READY, INIT_FAILED, RESPONSES, DONE, CALL, CALL_CANCEL, STOPPED = 10, 11, 12, 13, 14, 15, 16

Frame = tuple[Any, ...]
_LENGTH = struct.Struct("<I")
_READ_SIZE = 1 << 18


def encode(frame: Frame) -> bytes:
    body = pickle.dumps(frame, protocol=5)
    return _LENGTH.pack(len(body)) + body


def encode_error(exc: BaseException) -> object:
    """An exception as it can cross: TritiumError by its code, others pickled if they
    survive it, else as their text."""
    if isinstance(exc, TritiumError):
        return ("tritium", exc.code.name, exc.message)
    try:
        if type(pickle.loads(pickle.dumps(exc))) is type(exc):
            return exc
    except Exception:
        pass
    return ("text", f"{type(exc).__name__}: {exc}")


def decode_error(value: object) -> BaseException:
    if isinstance(value, BaseException):
        return value
    if isinstance(value, tuple) and len(value) == 3 and value[0] == "tritium":
        return TritiumError(ErrorCode[value[1]], value[2])
    return CallFailed(str(value[1]) if isinstance(value, tuple) else str(value))


class FrameReader:
    """Cuts a byte stream into frames; keeps what is left of a partial one."""

    def __init__(self) -> None:
        self._pending = bytearray()
        # Received into, again and again: ``recv(n)`` would allocate n bytes each time (and
        # for n this large, glibc maps and unmaps them: ~50 µs a call, measured).
        self._buffer = bytearray(_READ_SIZE)
        self._view = memoryview(self._buffer)

    def receive(self, sock: socket.socket) -> list[Frame] | None:
        """The frames completed by one read of ``sock``; None at end of file."""
        count = sock.recv_into(self._buffer)
        if not count:
            return None
        return self.feed(self._view[:count])

    def feed(self, data: bytes | memoryview) -> list[Frame]:
        if self._pending:
            self._pending += data
            buffer: bytes | bytearray | memoryview = self._pending
        else:
            buffer = data
        frames: list[Frame] = []
        at, end = 0, len(buffer)
        view = memoryview(buffer)
        while end - at >= 4:
            (length,) = _LENGTH.unpack_from(buffer, at)
            if end - at - 4 < length:
                break
            frames.append(pickle.loads(view[at + 4:at + 4 + length]))
            at += 4 + length
        view.release()
        if at == end:
            self._pending = bytearray()
        elif buffer is self._pending:
            del self._pending[:at]
        else:
            self._pending = bytearray(buffer[at:])
        return frames


# -- the server's end --------------------------------------------------------------
class ParentChannel:
    """The server's end: read by the loop, written without blocking it.

    Frames sent in one loop iteration leave together in one ``send`` (several batches
    dispatched at once cost one system call).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket,
                 on_frame: Callable[[Frame], None], on_eof: Callable[[], None]) -> None:
        self._loop = loop
        self._sock = sock
        sock.setblocking(False)
        self._on_frame = on_frame
        self._on_eof = on_eof
        self._reader = FrameReader()
        self._outgoing: list[bytes] = []
        self._backlog = bytearray()  # what the socket did not take yet
        self._flush_pending = False
        self._writing = False
        self.closed = False
        loop.add_reader(sock.fileno(), self._readable)

    def send(self, frame: Frame) -> None:
        if self.closed:
            return
        self._outgoing.append(encode(frame))
        if not self._flush_pending:
            self._flush_pending = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_pending = False
        if self.closed or not self._outgoing:
            return
        data = self._outgoing[0] if len(self._outgoing) == 1 else b"".join(self._outgoing)
        self._outgoing.clear()
        if self._backlog:
            self._backlog += data
            return
        self._write(data)

    def _write(self, data: bytes | bytearray) -> None:
        try:
            sent = self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            return  # the child is gone: the reader sees EOF
        if sent < len(data):
            self._backlog += data[sent:]
            if not self._writing:
                self._writing = True
                self._loop.add_writer(self._sock.fileno(), self._writable)

    def _writable(self) -> None:
        backlog, self._backlog = self._backlog, bytearray()
        self._loop.remove_writer(self._sock.fileno())
        self._writing = False
        self._write(backlog)

    def _readable(self) -> None:
        try:
            frames = self._reader.receive(self._sock)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            frames = None
        if frames is None:
            self.close()
            self._on_eof()
            return
        for frame in frames:
            self._on_frame(frame)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._loop.remove_reader(self._sock.fileno())
        if self._writing:
            self._loop.remove_writer(self._sock.fileno())
        self._sock.close()


class CallContext:
    """What a server-side call handler gets (calls.py ``HANDLERS``)."""

    def __init__(self, instance: Any, call_id: int, parents: Sequence[Any],
                 send_reply: Callable[[int, object, Sequence[Any], bool], None],
                 cancellation: Cancellation) -> None:
        self.instance = instance
        self.call_id = call_id
        self.parents = parents  # the AdmittedRequests of the execute that made the call
        self.cancellation = cancellation  # the child cancelled the call, or it died
        self._send_reply = send_reply
        self.finished = False

    def reply(self, payload: object, buffers: Sequence[Any] = (), final: bool = False) -> None:
        if self.finished:
            return
        self.finished = final
        self._send_reply(self.call_id, payload, buffers, final)


# -- the child's end ---------------------------------------------------------------
class CallFailed(Exception):
    """A call's server-side handler raised something that could not travel as it is."""


class Call:
    """A call the child started; its replies arrive in order, the last one ``final``."""

    def __init__(self, link: ChildLink, call_id: int) -> None:
        self._link = link
        self.call_id = call_id
        self._items: collections.deque[tuple[object, list[memoryview], bool]
                                       | BaseException] = collections.deque()
        self._done = False  # the final reply (or an error) arrived
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    # called by the link, holding its condition
    def _deliver(self, item: tuple[object, list[memoryview], bool] | BaseException) -> None:
        self._items.append(item)
        if isinstance(item, BaseException) or item[2]:
            self._done = True
        waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            loop.call_soon_threadsafe(_settle, future)

    def _next(self) -> tuple[object, list[memoryview], bool] | None:
        item = self._items.popleft()
        if isinstance(item, BaseException):
            raise item
        return item

    def replies(self) -> Iterator[tuple[object, list[memoryview], bool]]:
        """Blocking: each reply ``(payload, buffers, final)`` as it arrives."""
        while True:
            self._link.wait_until(lambda: bool(self._items))
            item = self._next()
            assert item is not None
            yield item
            if item[2]:
                return

    def result(self) -> tuple[object, list[memoryview]]:
        """Blocking: the payload and buffers of the final reply."""
        for payload, buffers, final in self.replies():
            if final:
                return payload, buffers
        raise CallFailed("the call ended without a final reply")

    def cancel(self) -> None:
        if not self._done:
            self._link.send((CALL_CANCEL, self.call_id))

    async def async_replies(self) -> AsyncIterator[tuple[object, list[memoryview], bool]]:
        while True:
            await self._arrived()
            item = self._next()
            assert item is not None
            yield item
            if item[2]:
                return

    async def async_result(self) -> tuple[object, list[memoryview]]:
        async for payload, buffers, final in self.async_replies():
            if final:
                return payload, buffers
        raise CallFailed("the call ended without a final reply")

    async def _arrived(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            with self._link.condition:
                if self._items:
                    return
                future: asyncio.Future[None] = loop.create_future()
                self._waiters.append((loop, future))
            # Nobody may be reading the socket (a synchronous model's main thread is busy
            # in execute): a helper thread reads until this call hears something.
            self._link.ensure_reading(lambda: bool(self._items))
            await future


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class ChildLink:
    """The child's end. Any thread may send; reading is done by whichever thread needs a
    frame (one at a time): the main thread between batches, a thread waiting for a call's
    reply while the main thread executes, or a reader thread in ``serve_forever``."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        sock.setblocking(True)
        self._send_lock = threading.Lock()
        self.condition = threading.Condition()
        self._reading = False
        self._frames = FrameReader()
        self._calls: dict[int, Call] = {}
        self._next_call = 0
        self.closed = False
        # Set by the stub: what to do with frames that are not replies, and the arenas.
        self.on_frame: Callable[[Frame], None] = lambda frame: None
        self.writer: ArenaWriter | None = None
        self.reader: ArenaReader | None = None
        self.parent_slots: Callable[[], list[int]] = lambda: []

    # -- sending -------------------------------------------------------------
    def send(self, frame: Frame) -> None:
        data = encode(frame)
        with self._send_lock:
            self._sock.sendall(data)

    def pack(self, buffers: Sequence[Any]) -> Packed:
        if not buffers:
            return EMPTY
        assert self.writer is not None
        return self.writer.pack_buffers(buffers)

    def call(self, kind: str, payload: object, buffers: Sequence[Any] = (),
             parents: Sequence[int] | None = None) -> Call:
        """Start a call handled on the server by ``calls.HANDLERS[kind]``. ``parents``: the
        slots of the requests it belongs to; by default those of the running execute."""
        with self.condition:
            self._next_call += 1
            call = Call(self, self._next_call)
            self._calls[call.call_id] = call
        slots = self.parent_slots() if parents is None else list(parents)
        try:
            self.send((CALL, call.call_id, kind, payload, self.pack(buffers), slots))
        except OSError as exc:
            with self.condition:
                self._calls.pop(call.call_id, None)
                call._deliver(CallFailed(f"the server is gone: {exc}"))
        return call

    def close(self) -> None:
        self._sock.close()

    # -- receiving -----------------------------------------------------------
    def wait_until(self, ready: Callable[[], bool]) -> None:
        """Block until ``ready()`` (checked under ``condition``), reading frames meanwhile
        if no other thread is; raises EOFError once the server is gone."""
        while True:
            with self.condition:
                while not ready():
                    if self.closed:
                        raise EOFError("the server closed the channel")
                    if not self._reading:
                        self._reading = True
                        break
                    self.condition.wait()
                else:
                    return
            self._read_once()

    def ensure_reading(self, ready: Callable[[], bool]) -> None:
        """Make sure some thread reads until ``ready()``: start one if none does."""
        with self.condition:
            if self._reading or ready():
                return
        threading.Thread(target=self._read_until, args=(ready,), daemon=True,
                         name="tritium-call-reader").start()

    def _read_until(self, ready: Callable[[], bool]) -> None:
        with contextlib.suppress(EOFError):
            self.wait_until(ready)

    def serve_forever(self) -> None:
        """A reader thread's body: read and dispatch until the server goes away."""
        with contextlib.suppress(EOFError):
            self.wait_until(lambda: False)

    def _read_once(self) -> None:
        try:
            received = self._frames.receive(self._sock)
        except OSError:
            received = None
        frames = [(GONE,)] if received is None else received
        # Dispatched under the condition (``on_frame`` only queues), so that a thread woken
        # by notify_all finds what it waits for instead of blocking in recv.
        with self.condition:
            self._reading = False
            if received is None:
                self.closed = True
                for call in self._calls.values():
                    call._deliver(EOFError("the server closed the channel"))
                self._calls.clear()
            for frame in frames:
                if frame[0] in (REPLY, REPLY_ERROR):
                    self._reply(frame)
                else:
                    self.on_frame(frame)
            self.condition.notify_all()

    def _reply(self, frame: Frame) -> None:
        call = self._calls.get(frame[1])
        if call is None:
            return
        if frame[0] == REPLY_ERROR:
            del self._calls[frame[1]]
            call._deliver(decode_error(frame[2]))
            return
        _, call_id, payload, packed, final = frame
        assert self.reader is not None
        buffers = self.reader.unpack_buffers(packed) if packed[1] else []
        if final:
            del self._calls[call_id]
        call._deliver((payload, buffers, final))
