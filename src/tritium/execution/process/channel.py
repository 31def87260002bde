"""Framed messages between the server and an instance process over a Unix socketpair.

Each frame is one message of messages.py, in the one codec (codec.py): small metadata
only; tensor bytes travel through the shared-memory arenas (shm.py) and a message names
their block. The server's end is read by its event loop (``add_reader``) and never blocks;
the child's end blocks. Besides execute traffic the child can start *calls* (BLS,
metrics, logging: calls.py) and receive any number of replies to each.

The server's end treats the child as untrusted: a frame that does not decode, one larger
than ``codec.MAX_FRAME``, or a child that keeps the channel full for ``flood_s`` seconds
ends the channel with the reason (``on_broken``), and the instance with it. One turn of the
loop decodes at most ``FRAMES_PER_TURN`` frames; while more wait, the socket is not read,
so a child sending faster than the server handles its frames blocks in ``send``, and the
other models' work keeps its turns.
"""

from __future__ import annotations

import collections
import contextlib
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tritium.core.cancellation import Cancellation
from tritium.execution.process import messages as msg
from tritium.execution.process.calls import CallReply
from tritium.execution.process.codec import (
    FrameError,
    FrameReader,
    decode_all,
    encode,
    encode_onto,
)
from tritium.execution.process.messages import EMPTY, Packed
from tritium.execution.process.shm import ArenaReader, ArenaWriter

if TYPE_CHECKING:
    import asyncio  # the child's end needs it only for an async model's calls

# The descriptors an instance process inherits, by name: ``link=5,in=6,out=7,flags=8`` (the
# socket, the arena to it, the arena from it, the cancel flags).
FDS_ENV = "TRITIUM_PROCESS_FDS"
FD_NAMES = ("link", "in", "out", "flags")
_READ_SIZE = 1 << 18
FRAMES_PER_TURN = 64
FLOOD_S = float(os.environ.get("TRITIUM_PROCESS_FLOOD_SECS", 10.0))
_REPLIES = (msg.Reply, msg.ReplyError)


def fds_value(fds: Mapping[str, int]) -> str:
    """``FDS_ENV``'s value for ``fds`` (every name of ``FD_NAMES``)."""
    return ",".join(f"{name}={fds[name]}" for name in FD_NAMES)


def parse_fds(value: str) -> dict[str, int]:
    """The descriptors ``FDS_ENV`` names; ValueError unless it names each of ``FD_NAMES``
    once, each a number."""
    fds: dict[str, int] = {}
    for entry in value.split(","):
        name, _, fd = entry.partition("=")
        if name not in FD_NAMES or name in fds or not fd.isdigit():
            raise ValueError(f"{FDS_ENV}: unexpected entry '{entry}'")
        fds[name] = int(fd)
    if len(fds) != len(FD_NAMES):
        raise ValueError(f"{FDS_ENV} names {', '.join(fds)}; expected {', '.join(FD_NAMES)}")
    return fds


# -- the server's end --------------------------------------------------------------
class ParentChannel:
    """The server's end: read by the loop, written without blocking it.

    Frames sent in one loop iteration leave together in one ``send`` (several batches
    dispatched at once cost one system call).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket,
                 on_message: Callable[[Any], None], on_eof: Callable[[], None],
                 on_broken: Callable[[str], None], flood_s: float = FLOOD_S) -> None:
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        sock.setblocking(False)
        self._on_message = on_message
        # Messages of these types go straight to their handler instead (the frequent
        # ones: no hop through ``on_message`` per message).
        self.routes: dict[type, Callable[[Any], None]] = {}
        self._on_eof = on_eof
        self._on_broken = on_broken
        self._flood_s = flood_s
        self._frames = FrameReader()
        # Received into, again and again: ``recv(n)`` would allocate n bytes each time (and
        # for n this large, glibc maps and unmaps them: ~50 µs a call, measured).
        self._buffer = bytearray(_READ_SIZE)
        self._view = memoryview(self._buffer)
        self._outgoing = bytearray()  # frames sent in this loop iteration
        self._backlog = bytearray()  # what the socket did not take yet
        self._flush_pending = False
        self._writing = False
        self._reading = True
        self._full_since = 0.0  # since when every read brought more than a turn's frames
        self._paused = False  # the frames of the current read needed more than one turn
        self.closed = False
        loop.add_reader(self._fd, self._readable)

    def send(self, message: Any) -> None:
        if self.closed:
            return
        encode_onto(message, self._outgoing)
        if not self._flush_pending:
            self._flush_pending = True
            self._loop.call_soon(self._flush)

    def send_now(self, message: Any) -> None:
        """``send``, written at once with the frames still waiting for this iteration's
        write: for a frame the child is idle waiting for, which nothing else would join
        (one write, without a callback to schedule and run)."""
        if self.closed:
            return
        encode_onto(message, self._outgoing)
        self._write_outgoing()  # a flush still pending finds nothing left to write

    def _flush(self) -> None:
        self._flush_pending = False
        if not self.closed and self._outgoing:
            self._write_outgoing()

    def _write_outgoing(self) -> None:
        data, self._outgoing = self._outgoing, bytearray()
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
                self._loop.add_writer(self._fd, self._writable)

    def _writable(self) -> None:
        backlog, self._backlog = self._backlog, bytearray()
        self._loop.remove_writer(self._fd)
        self._writing = False
        self._write(backlog)

    # -- reading -------------------------------------------------------------
    def _readable(self, waiting: bool = False) -> None:
        """The socket is readable: read, and handle a turn's frames of what came; or
        (``waiting``, the next turn of a paused read) handle a turn's frames that wait.
        One function for both: no second frame for every read."""
        if self.closed:
            return
        count = 0
        if not waiting:
            try:
                count = self._sock.recv_into(self._buffer)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                count = 0
            if not count:
                self.close()
                self._on_eof()
                return
            self._paused = False
        frames = self._frames
        try:
            messages = (decode_all(frames.bodies(FRAMES_PER_TURN)) if waiting
                        else frames.messages(self._view, count, FRAMES_PER_TURN))
            routes, on_message = self.routes, self._on_message
            for message in messages:
                routes.get(type(message), on_message)(message)
                if self.closed:
                    return
            # Fewer than a turn's frames: bodies() stopped at the first incomplete one.
            more = len(messages) == FRAMES_PER_TURN and frames.has_frame()
        except FrameError as exc:
            self._broken(str(exc))
            return
        except Exception as exc:  # what a frame made of the server's state: end it here
            self._broken(f"its frame could not be handled: {type(exc).__name__}: {exc}")
            return
        if more or self._paused or not self._reading:
            self._turn_ended(more)
        else:  # the usual read: its frames all fit one turn, the child is not flooding
            self._full_since = 0.0

    def _turn_ended(self, more: bool) -> None:
        if more:
            self._pause()
            return
        # A read whose frames all fit one turn: the child is not flooding. Only reads that
        # each need more turns than one, back to back for flood_s, are a flood.
        if not self._paused:
            self._full_since = 0.0
        self._resume()

    def _flooding(self) -> bool:
        """Whether the channel has been full for longer than ``flood_s`` (then it ends)."""
        now = time.monotonic()
        if not self._full_since:
            self._full_since = now
        elif now - self._full_since > self._flood_s:
            self._broken(f"it kept its channel full for over {self._flood_s:g} s (a flood "
                         "of frames)")
            return True
        return False

    def _pause(self) -> None:
        """More than a turn's frames wait: handle them next turn, read nothing meanwhile."""
        self._paused = True
        if self._flooding():
            return
        if self._reading:
            self._reading = False
            self._loop.remove_reader(self._fd)
        self._loop.call_soon(self._readable, True)

    def _resume(self) -> None:
        if not self._reading:
            self._reading = True
            self._loop.add_reader(self._fd, self._readable)

    def _broken(self, reason: str) -> None:
        self.close()
        self._on_broken(reason)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._reading:
            self._loop.remove_reader(self._fd)
        if self._writing:
            self._loop.remove_writer(self._fd)
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
    """A call ended without the answer it was made for."""


class Call:
    """A call the child started; its replies arrive in order, the last one ``final``."""

    def __init__(self, link: ChildLink, call_id: int) -> None:
        self._link = link
        self.call_id = call_id
        self._items: collections.deque[CallReply | BaseException] = collections.deque()
        self._done = False  # the final reply (or an error) arrived
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    # called by the link, holding its condition
    def _deliver(self, item: CallReply | BaseException) -> None:
        self._items.append(item)
        if isinstance(item, BaseException) or item.final:
            self._done = True
        waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            loop.call_soon_threadsafe(_settle, future)

    def _next(self) -> CallReply:
        item = self._items.popleft()
        if isinstance(item, BaseException):
            raise item
        return item

    def replies(self) -> Iterator[CallReply]:
        """Blocking: each reply as it arrives."""
        while True:
            self._link.wait_until(lambda: bool(self._items))
            item = self._next()
            yield item
            if item.final:
                return

    def result(self) -> CallReply:
        """Blocking: the final reply."""
        for reply in self.replies():
            if reply.final:
                return reply
        raise CallFailed("the call ended without a final reply")

    def cancel(self) -> None:
        if not self._done:
            self._link.send(msg.CallCancel(self.call_id))

    async def async_replies(self) -> AsyncIterator[CallReply]:
        while True:
            await self._arrived()
            item = self._next()
            yield item
            if item.final:
                return

    async def async_result(self) -> CallReply:
        async for reply in self.async_replies():
            if reply.final:
                return reply
        raise CallFailed("the call ended without a final reply")

    async def _arrived(self) -> None:
        import asyncio

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
        # The condition's own lock, taken directly where nothing waits (a C call, not the
        # condition's Python methods); readers notify only when a thread waits.
        self._lock = threading.Lock()
        self.condition = threading.Condition(self._lock)
        self._waiting = 0
        self._reading = False
        self._frames = FrameReader()
        self._buffer = bytearray(_READ_SIZE)
        self._view = memoryview(self._buffer)
        self._calls: dict[int, Any] = {}  # Call, or a fork's relayed call
        self._next_call = 0
        self.closed = False
        # Set by the stub: what to do with messages that are not replies, and the arenas.
        self.on_frame: Callable[[Any], None] = lambda message: None
        self.writer: ArenaWriter | None = None
        self.reader: ArenaReader | None = None
        self.parent_slots: Callable[[], list[int]] = lambda: []

    # -- sending -------------------------------------------------------------
    def send(self, message: Any) -> None:
        data = encode(message)
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
            self.send(msg.Call(call.call_id, kind, payload, self.pack(buffers), slots))
        except OSError as exc:
            with self.condition:
                self._calls.pop(call.call_id, None)
                call._deliver(CallFailed(f"the server is gone: {exc}"))
        return call

    def relay(self, call: msg.Call, relayed: Any) -> int:
        """Send a call a fork of the model made (forked.py) as one of ours; its replies go
        to ``relayed.forward`` as they come, their tensors unread. Returns its id here."""
        with self.condition:
            self._next_call += 1
            call_id = self._next_call
            self._calls[call_id] = relayed
        self.send(msg.Call(call_id, call.kind, call.payload, call.buffers, []))
        # The instance's own threads may all be busy elsewhere (execute waits on the pool):
        # a thread waits for the replies, reading whenever no other thread does.
        threading.Thread(target=self._read_until, args=(lambda: call_id not in self._calls,),
                         daemon=True, name="tritium-relay-reader").start()
        return call_id

    def close(self) -> None:
        self._sock.close()

    # -- receiving -----------------------------------------------------------
    def wait_until(self, ready: Callable[[], object]) -> None:
        """Block until ``ready()`` (checked under ``condition``), reading frames meanwhile
        if no other thread is; raises EOFError once the server is gone."""
        lock = self._lock
        while True:
            with lock:
                if ready():
                    return
                if self.closed:
                    raise EOFError("the server closed the channel")
                if self._reading:  # another thread reads: it notifies when it dispatched
                    self._waiting += 1
                    try:
                        self.condition.wait()
                    finally:
                        self._waiting -= 1
                    continue
                self._reading = True
            if self._read_once(ready):
                return

    def ensure_reading(self, ready: Callable[[], bool]) -> None:
        """Make sure some thread reads until ``ready()``: one that waits for it and reads
        whenever no other thread does (the one reading now may stop once it has its own
        answer)."""
        with self.condition:
            if ready():
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

    def _read_once(self, ready: Callable[[], object]) -> object:
        """Read and dispatch what the server sent; whether ``ready()`` holds then."""
        try:
            count = self._sock.recv_into(self._buffer)
        except OSError:
            count = 0
        messages: list[Any] = []
        if count:
            # The server is trusted as far as the child goes: a frame it cannot read ends
            # the child's link as end of file would.
            try:
                messages = self._frames.messages(self._view, count, 1 << 30)
            except FrameError:
                count = 0
        if not count:
            messages = [msg.GONE]
        # Dispatched under the condition (``on_frame`` only queues), so that a thread woken
        # by notify_all finds what it waits for instead of blocking in recv.
        with self._lock:
            self._reading = False
            if not count:
                self.closed = True
                for call in self._calls.values():
                    if isinstance(call, Call):
                        call._deliver(EOFError("the server closed the channel"))
                self._calls.clear()
            for message in messages:
                if type(message) in _REPLIES:
                    self._reply(message)
                else:
                    self.on_frame(message)
            if self._waiting:
                self.condition.notify_all()
            return ready()

    def _reply(self, message: msg.Reply | msg.ReplyError) -> None:
        call = self._calls.get(message.call_id)
        if call is None:
            return
        if not isinstance(call, Call):  # a fork's (forked.py): passed on as it came
            if isinstance(message, msg.ReplyError) or message.final:
                del self._calls[message.call_id]
            call.forward(message)
            return
        if isinstance(message, msg.ReplyError):
            del self._calls[message.call_id]
            call._deliver(message.error.error())
            return
        assert self.reader is not None
        buffers = self.reader.unpack_buffers(message.buffers) if message.buffers.tensors else []
        if message.final:
            del self._calls[message.call_id]
        call._deliver(CallReply(message.payload, buffers, message.final))
