"""ProcessInstance: a model instance whose code runs in a process of its own (a stub).

Driven by ``supervisor.SupervisedInstance``. The server side lives on the event
loop: ``submit`` copies a batch's inputs into the shared-memory arena and sends one small
EXECUTE frame; the child answers with one DONE frame carrying the returned responses (and
RESPONSES frames for what a model sends itself, streamed as sent). Cancel flags live in
shared memory (flags.py): a request's ``Cancellation`` writes its byte the moment it fires.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from tritium.core.cancellation import Cancellation, CancelReason
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.request import AdmittedRequest
from tritium.core.response import (
    DeferredWakes,
    InferenceResponse,
    ResponseStream,
    StreamClosedError,
    wake_all,
)
from tritium.execution import placement as placement_module
from tritium.execution.backend import InstanceInfo
from tritium.execution.instance import end_unstarted, settle
from tritium.execution.process import channel as ch
from tritium.execution.process.channel import CallContext, Frame, ParentChannel
from tritium.execution.process.flags import FlagTable
from tritium.execution.process.shm import (
    DEFAULT_CAPACITY,
    RING_BYTES,
    ArenaReader,
    ArenaWriter,
    Mapping,
    create_memfd,
)

log = logging.getLogger("tritium.execution")

STUB_MODULE = "tritium.execution.process.stub"
PARENT_PID_ENV = "TRITIUM_PARENT_PID"  # death.py: the pid the child must not outlive
DoneCallback = Callable[[Any, list[AdmittedRequest], int, list[ResponseStream]], None]
_batch_ids = itertools.count(1)


def default_command(info: InstanceInfo) -> list[str]:
    return [sys.executable, "-m", STUB_MODULE]


class _Pending:
    """A request the child holds: its slot is given back once its final response came
    and its execute returned (a decoupled model may answer after returning)."""

    __slots__ = ("batch_done", "final", "request")

    def __init__(self, request: AdmittedRequest) -> None:
        self.request = request
        self.final = False
        self.batch_done = False


class _Batch:
    __slots__ = ("batch", "slots", "started")

    def __init__(self, batch: list[AdmittedRequest], slots: list[int]) -> None:
        self.batch = batch
        self.slots = slots
        self.started = time.monotonic_ns()


class ProcessInstance:
    def __init__(self, info: InstanceInfo, config: Any, loop: asyncio.AbstractEventLoop,
                 on_done: DoneCallback, service: Any = None) -> None:
        self.info = info
        self.name = info.instance_name
        self.config = config
        self.service = service
        self._loop = loop
        self._on_done = on_done
        # Hooks (SUPERVISION): the child's argv and environment.
        self.spawn_command: Callable[[InstanceInfo], list[str]] = default_command
        self.spawn_env: Callable[[dict[str, str]], dict[str, str]] | None = None
        self.pid: int | None = None
        self.returncode: int | None = None
        self.decoupled = False
        self.is_async = False
        self._process: asyncio.subprocess.Process | None = None
        self._exited: asyncio.Future[int] = loop.create_future()
        self._ready: asyncio.Future[None] = loop.create_future()
        self._channel: ParentChannel | None = None
        self._flags = FlagTable()
        self._pending: dict[int, _Pending] = {}
        self._batches: dict[int, _Batch] = {}
        self._calls: dict[int, tuple[CallContext, asyncio.Task[None]]] = {}
        self._writer: ArenaWriter | None = None
        self._reader: ArenaReader | None = None
        self._dead = False
        self._stopping = False

    # -- lifecycle -----------------------------------------------------------
    async def start(self) -> None:
        """Spawn the process and wait for the model's ``initialize`` to finish."""
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        down = create_memfd(f"tritium-{self.name}-in", DEFAULT_CAPACITY)
        up = create_memfd(f"tritium-{self.name}-out", DEFAULT_CAPACITY)
        self._writer = ArenaWriter(Mapping(down, DEFAULT_CAPACITY))
        self._reader = ArenaReader(Mapping(up, DEFAULT_CAPACITY))
        fds = [child_sock.fileno(), down, up, self._flags.fd]
        env = dict(os.environ)
        env[ch.FDS_ENV] = ",".join(map(str, fds))
        env[PARENT_PID_ENV] = str(os.getpid())
        if self.spawn_env is not None:
            env = self.spawn_env(env)
        try:
            self._process = await asyncio.create_subprocess_exec(
                *self.spawn_command(self.info), pass_fds=fds, env=env)
        finally:
            child_sock.close()
            os.close(down)
            os.close(up)
        self.pid = self._process.pid
        self._channel = ParentChannel(self._loop, parent_sock, self._on_frame, self._on_eof)
        self._loop.create_task(self._watch(self._process))
        placement = placement_module.current()
        self._channel.send((ch.INIT, asdict(self.info), self.config.SerializeToString(),
                            DEFAULT_CAPACITY, RING_BYTES, self._flags.slots,
                            (placement.home, sorted(placement.everywhere))))
        await asyncio.shield(self._ready)

    def submit(self, batch: list[AdmittedRequest]) -> None:
        live: list[AdmittedRequest] = []
        for request in batch:
            if request.cancellation.is_cancelled():
                end_unstarted(request)
            elif len(self._pending) + len(live) >= self._flags.slots:
                self._fail([request], TritiumError(ErrorCode.UNAVAILABLE, (
                    f"instance {self.name} holds {self._flags.slots} requests already")))
            else:
                live.append(request)
        if not live or self._dead or self._channel is None:
            self._fail(live, self.crash_error())
            self._loop.call_soon(self._on_done, self, batch, -1, [])
            return
        assert self._writer is not None
        descs, tensors, slots = [], [], []
        for request in live:
            slot = self._flags.acquire(request.cancellation)
            self._pending[slot] = _Pending(request)
            slots.append(slot)
            core = request.request
            inputs = list(core.inputs.values())
            tensors.extend(inputs)
            descs.append((slot, core.id, core.correlation_id, core.flags, core.timeout_us,
                          core.parameters, core.requested_output_names(), core.model_name,
                          len(inputs)))
        batch_id = next(_batch_ids)
        self._batches[batch_id] = _Batch(batch, slots)
        self._channel.send((ch.EXECUTE, batch_id, descs, self._writer.pack(tensors)))

    def stop(self) -> None:
        """Ask the process to finalize the model and exit; see ``wait_stopped``."""
        self._stopping = True
        if self._channel is not None and not self._dead:
            self._channel.send((ch.STOP,))

    async def wait_stopped(self) -> None:
        if self._process is None:
            return
        await asyncio.shield(self._exited)

    def exited(self) -> asyncio.Future[int]:
        """Resolves with the exit status once the process is gone, however it ended."""
        return self._exited

    @property
    def alive(self) -> bool:
        """False from the moment the child is known gone (end of file or exit), before
        ``exited`` resolves: the supervisor must not hand the slot back before then."""
        return not self._dead

    def kill(self) -> None:
        if self._process is not None and self.returncode is None:
            self._process.kill()

    def crash_error(self) -> TritiumError:
        """What the requests in flight get when the process is gone (Triton's words)."""
        return TritiumError(ErrorCode.INTERNAL,
                            f"Failed to process the request(s) for model '{self.info.model_name}'"
                            f", message: Stub process '{self.name}' is not healthy.")

    # -- frames from the child -----------------------------------------------
    def _on_frame(self, frame: Frame) -> None:
        kind = frame[0]
        if kind == ch.DONE:
            self._done(frame[1], frame[2], frame[3], frame[4])
        elif kind == ch.RESPONSES:
            for slot, response in frame[1]:
                self._deliver(slot, response)
        elif kind == ch.CALL:
            self._start_call(*frame[1:])
        elif kind == ch.CALL_CANCEL:
            entry = self._calls.get(frame[1])
            if entry is not None:
                entry[0].cancellation.cancel(CancelReason.CLIENT_CANCELLED)
        elif kind == ch.READY:
            self.decoupled, self.is_async = frame[1], frame[2]
            settle(self._ready, None)
        elif kind == ch.INIT_FAILED:
            settle(self._ready, TritiumError(ErrorCode[frame[1]], frame[2]))

    def _deliver(self, slot: int, packed: tuple[Any, ...]) -> None:
        pending = self._pending.get(slot)
        if pending is None:
            return
        final, flag_only, error, parameters, tensors = packed
        if flag_only:
            response = InferenceResponse.final_flag()
        elif error is not None:
            response = InferenceResponse(error=TritiumError(ErrorCode[error[0]], error[1]),
                                         final=final)
        else:
            assert self._reader is not None
            response = InferenceResponse(outputs=self._reader.unpack(tensors),
                                         parameters=parameters, final=final)
        try:
            pending.request.stream.send_nowait(response)
        except StreamClosedError:
            log.error("instance %s: a response after the final one was dropped", self.name)
        if final:
            pending.final = True
            if pending.batch_done:
                self._release(slot)

    def _done(self, batch_id: int, elapsed: int, responses: list[Any],
              released: list[tuple[int, int]]) -> None:
        for slot, flags in released:
            pending = self._pending.get(slot)
            if pending is not None:
                pending.request.release_flags = flags
        # The responses execute returned wake when on_done says (as an instance thread's
        # do: the scheduler may hold them back to keep the dispatch order).
        with DeferredWakes() as woken:
            for slot, response in responses:
                self._deliver(slot, response)
        entry = self._batches.pop(batch_id, None)
        if entry is None:
            wake_all(woken)
            return
        for slot in entry.slots:
            pending = self._pending.get(slot)
            if pending is not None:
                pending.batch_done = True
                if pending.final:
                    self._release(slot)
        self._on_done(self, entry.batch, elapsed, woken)

    def _release(self, slot: int) -> None:
        del self._pending[slot]
        self._flags.release(slot)

    # -- calls the child makes -------------------------------------------------
    def _start_call(self, call_id: int, kind: str, payload: object, packed: Any,
                    slots: list[int]) -> None:
        assert self._reader is not None
        buffers = self._reader.unpack_buffers(packed)
        parents = [self._pending[s].request for s in slots if s in self._pending]
        context = CallContext(self, call_id, parents, self._send_reply, Cancellation(self._loop))
        task = self._loop.create_task(self._run_call(context, kind, payload, buffers))
        self._calls[call_id] = (context, task)

    async def _run_call(self, context: CallContext, kind: str, payload: object,
                        buffers: list[memoryview]) -> None:
        try:
            from tritium.execution.process import calls  # BRIDGE's registry
            handlers = getattr(calls, "HANDLERS", {})
        except ImportError:
            handlers = {}
        try:
            handler = handlers.get(kind)
            if handler is None:
                raise TritiumError(ErrorCode.UNSUPPORTED, f"no handler for call '{kind}'")
            await handler(context, payload, buffers)
            if not context.finished:
                context.reply(None, (), True)
        except Exception as exc:
            if not context.finished and self._channel is not None:
                context.finished = True
                self._channel.send((ch.REPLY_ERROR, context.call_id, ch.encode_error(exc)))
        finally:
            self._calls.pop(context.call_id, None)

    def _send_reply(self, call_id: int, payload: object, buffers: Sequence[Any],
                    final: bool) -> None:
        if self._channel is None or self._dead:
            return
        assert self._writer is not None
        packed = self._writer.pack_buffers(buffers) if buffers else ch.EMPTY
        self._channel.send((ch.REPLY, call_id, payload, packed, final))

    # -- the end -------------------------------------------------------------
    def _on_eof(self) -> None:
        self._gone()

    async def _watch(self, process: asyncio.subprocess.Process) -> None:
        code = await process.wait()
        self.returncode = code
        self._gone()
        if self._channel is not None:
            self._channel.close()
        self._flags.close()
        settle(self._ready, TritiumError(
            ErrorCode.INTERNAL, f"instance process of '{self.name}' exited ({code}) "
            "before the model was initialized"))
        if not self._exited.done():
            self._exited.set_result(code)

    def _gone(self) -> None:
        """The child is gone: what it held fails now, every batch is reported done."""
        if self._dead:
            return
        self._dead = True
        error = self.crash_error()
        for pending in self._pending.values():
            self._fail([pending.request], error)
        self._pending.clear()
        batches, self._batches = self._batches, {}
        for entry in batches.values():
            self._on_done(self, entry.batch, time.monotonic_ns() - entry.started, [])
        for context, _ in list(self._calls.values()):
            context.cancellation.cancel(CancelReason.CLIENT_DISCONNECTED)
        if not self._stopping and self._ready.done():
            log.error("instance process %s (pid %s) of model '%s' is gone", self.name,
                      self.pid, self.info.model_name)

    @staticmethod
    def _fail(requests: list[AdmittedRequest], error: TritiumError) -> None:
        for request in requests:
            stream = request.stream
            if not stream.closed:
                with contextlib.suppress(StreamClosedError):
                    stream.send_nowait(InferenceResponse.failure(error))
