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
from typing import Any

import msgspec

from tritium.core.cancellation import Cancellation, CancelReason
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.request import RELEASE_RESCHEDULE, AdmittedRequest
from tritium.core.response import (
    InferenceResponse,
    ResponseStream,
    StreamClosedError,
    wake_all,
    wakes,
)
from tritium.core.tracing import (
    COMPUTE_END,
    COMPUTE_INPUT_END,
    COMPUTE_OUTPUT_START,
    COMPUTE_START,
    record,
    traces_of,
)
from tritium.core.types import Tensor
from tritium.execution import placement as placement_module
from tritium.execution.backend import InstanceInfo
from tritium.execution.instance import end_unstarted, settle
from tritium.execution.process import calls
from tritium.execution.process import channel as ch
from tritium.execution.process import messages as msg
from tritium.execution.process.channel import CallContext, ParentChannel
from tritium.execution.process.codec import FrameError
from tritium.execution.process.flags import FlagTable
from tritium.execution.process.messages import EMPTY, ErrorBody
from tritium.execution.process.shm import (
    DEFAULT_CAPACITY,
    ArenaReader,
    ArenaWriter,
    Mapping,
    create_memfd,
)
from tritium.execution.process.shm import layout as shm_layout

log = logging.getLogger("tritium.execution")

# The process the server starts: the guardian, which forks the instance process (stub).
LAUNCH_MODULE = "tritium.execution.process.guardian"
PARENT_PID_ENV = "TRITIUM_PARENT_PID"  # guardian.py: the pid it must not outlive
DoneCallback = Callable[[Any, list[AdmittedRequest], int, list[ResponseStream]], None]
_batch_ids = itertools.count(1)


def default_command(info: InstanceInfo) -> list[str]:
    return [sys.executable, "-m", LAUNCH_MODULE]


class _Batch(msgspec.Struct):
    """A batch the process holds (a Struct: made in C, one per batch)."""

    batch: list[AdmittedRequest]
    slots: list[int]
    traced: bool
    waiting: bool  # sent while another ran: it has not begun yet
    started: int  # monotonic ns


def _compute_started(entry: _Batch, ns: int) -> None:
    """A traced batch begins: its compute span covers the round trip to the process."""
    traces = traces_of(entry.batch)
    if traces is not None:
        record(traces, COMPUTE_START, ns)
        record(traces, COMPUTE_INPUT_END, time.monotonic_ns())


class ProcessInstance:
    def __init__(self, info: InstanceInfo, config: Any, loop: asyncio.AbstractEventLoop,
                 on_done: DoneCallback, service: Any = None) -> None:
        self.info = info
        self.name = info.instance_name
        self.config = config
        self.service = service
        self._loop = loop
        self._on_done = on_done
        # Where the dones of batches it ran go, and as whom (``report_to``).
        self._report: DoneCallback = on_done
        self._owner: Any = self
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
        # The requests the child holds, by slot. A slot is given back once the request's
        # final response came and its execute returned (a decoupled model may answer
        # after returning): ``_finished`` holds those whose final came first, ``_returned``
        # those whose execute returned first.
        self._pending: dict[int, AdmittedRequest] = {}
        self._finished: set[int] = set()
        self._returned: set[int] = set()
        self._batches: dict[int, _Batch] = {}
        self._calls: dict[int, tuple[CallContext, asyncio.Task[None]]] = {}
        self._writer: ArenaWriter | None = None
        self._reader: ArenaReader | None = None
        # False from the moment the child is known gone (end of file or exit), before
        # ``exited`` resolves: the supervisor must not hand the slot back before then.
        self.alive = True
        self._stopping = False

    # -- lifecycle -----------------------------------------------------------
    async def start(self) -> None:
        """Spawn the process and wait for the model's ``initialize`` to finish."""
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        arena = shm_layout()
        down = create_memfd(f"{arena.name_prefix}{self.name}-in", DEFAULT_CAPACITY)
        up = create_memfd(f"{arena.name_prefix}{self.name}-out", DEFAULT_CAPACITY)
        self._writer = ArenaWriter(Mapping(down, DEFAULT_CAPACITY), arena.ring_bytes)
        self._reader = ArenaReader(Mapping(up, DEFAULT_CAPACITY))
        fds = {"link": child_sock.fileno(), "in": down, "out": up, "flags": self._flags.fd}
        env = dict(os.environ)
        env[ch.FDS_ENV] = ch.fds_value(fds)
        env[PARENT_PID_ENV] = str(os.getpid())
        if self.spawn_env is not None:
            env = self.spawn_env(env)
        try:
            self._process = await asyncio.create_subprocess_exec(
                *self.spawn_command(self.info), pass_fds=list(fds.values()), env=env)
        finally:
            child_sock.close()
            os.close(down)
            os.close(up)
        self.pid = self._process.pid
        self._channel = ParentChannel(self._loop, parent_sock, self._on_message, self._on_eof,
                                      self._on_broken)
        self._channel.routes[msg.Done] = self._done
        self._loop.create_task(self._watch(self._process))
        placement = placement_module.current()
        self._channel.send(msg.Init(self.info, DEFAULT_CAPACITY, arena.ring_bytes,
                                    self._flags.slots, sorted(placement.everywhere),
                                    placement.home))
        await asyncio.shield(self._ready)

    def submit(self, batch: list[AdmittedRequest]) -> None:
        channel = self._channel
        if not self.alive or channel is None:
            self._refuse(batch)
            return
        assert self._writer is not None
        descs: list[msg.RequestDesc] = []
        tensors: list[Tensor] = []
        slots: list[int] = []
        traced = False
        pending, flags = self._pending, self._flags
        for request in batch:  # one pass: every request of a small batch crosses
            cancellation = request.cancellation
            if cancellation.reason is not None:
                end_unstarted(request)
                continue
            slot = flags.acquire(cancellation)
            if slot < 0:
                self._fail([request], TritiumError(ErrorCode.UNAVAILABLE, (
                    f"instance {self.name} holds {flags.slots} requests already")))
                continue
            pending[slot] = request
            slots.append(slot)
            core = request.request
            inputs = core.inputs.values()
            tensors.extend(inputs)
            trace = core.trace
            if trace is not None:
                traced = True
            # Encoded at once (``send``): the request's own parameters need no copy.
            descs.append(msg.RequestDesc(
                slot, core.id, core.correlation_id, core.flags, core.timeout_us,
                core.parameters,
                None if core.requested_outputs is None else core.requested_output_names(),
                core.model_name, len(inputs),
                None if trace is None else trace.context() or ""))
        try:
            packed = self._writer.pack(tensors)
        except TritiumError as exc:  # too large for the arena and for a frame
            for slot in slots:
                self._fail([pending[slot]], exc)
                self._release(slot)
            slots.clear()
        if not slots:
            self._loop.call_soon(self._on_done, self, batch, -1, [])
            return
        batch_id = next(_batch_ids)
        behind = bool(self._batches)  # it waits at the process until those are done
        entry = self._batches[batch_id] = _Batch(batch, slots, traced, behind,
                                                 time.monotonic_ns())
        execute = msg.Execute(batch_id, descs, packed)
        if behind:  # batches sent in the same iteration of the loop leave in one write
            channel.send(execute)
        else:  # the process is idle: it starts at once (the next ones follow together)
            channel.send_now(execute)
        if traced and not behind:
            _compute_started(entry, entry.started)

    def _refuse(self, batch: list[AdmittedRequest]) -> None:
        """A batch for a process that is gone: answered at once, reported done soon."""
        for request in batch:
            if request.cancellation.reason is not None:
                end_unstarted(request)
            else:
                self._fail([request], self.crash_error())
        self._loop.call_soon(self._on_done, self, batch, -1, [])

    def report_to(self, owner: Any, on_done: DoneCallback) -> bool:
        """From now on, the done of a batch it ran goes straight to ``on_done`` as
        ``owner``'s (the supervisor's own callback is left for the dones of batches it
        did not run: refused, or ended by its death)."""
        self._owner, self._report = owner, on_done
        return True

    def stop(self) -> None:
        """Ask the process to finalize the model and exit; see ``wait_stopped``."""
        self._stopping = True
        if self._channel is not None and self.alive:
            self._channel.send(msg.Stop())

    async def wait_stopped(self) -> None:
        if self._process is None:
            return
        await asyncio.shield(self._exited)

    def exited(self) -> asyncio.Future[int]:
        """Resolves with the exit status once the process is gone, however it ended."""
        return self._exited

    def kill(self) -> None:
        """End the instance process and everything it started, at once (the guardian
        SIGKILLs the whole tree when it is asked to end)."""
        if self._process is not None and self.returncode is None:
            self._process.terminate()

    def crash_error(self) -> TritiumError:
        """What the requests in flight get when the process is gone (Triton's words)."""
        return TritiumError(ErrorCode.INTERNAL,
                            f"Failed to process the request(s) for model '{self.info.model_name}'"
                            f", message: Stub process '{self.name}' is not healthy.")

    # -- messages from the child ---------------------------------------------
    def _on_message(self, message: Any) -> None:
        kind = type(message)
        if kind is msg.Done:
            self._done(message)
        elif kind is msg.Responses:
            for body in message.items:
                self._deliver(body)
        elif kind is msg.Call:
            self._start_call(message)
        elif kind is msg.CallCancel:
            entry = self._calls.get(message.call_id)
            if entry is not None:
                entry[0].cancellation.cancel(CancelReason.CLIENT_CANCELLED)
        elif kind is msg.Ready:
            self.decoupled, self.is_async = message.decoupled, message.is_async
            self.pid = message.pid  # what logs name: the process that runs model code
            settle(self._ready, None)
        elif kind is msg.InitFailed:
            settle(self._ready, message.error.error())
        elif kind is not msg.Stopped:
            raise FrameError(f"an instance process does not send {kind.__name__}")

    def _deliver(self, body: msg.ResponseBody) -> None:
        slot = body.slot
        request = self._pending.get(slot)
        if request is None:
            return
        if body.flag_only:
            response = InferenceResponse.final_flag()
        elif body.error is not None:
            response = InferenceResponse(error=body.error.error(), final=body.final)
        else:
            assert self._reader is not None
            tensors = body.tensors or EMPTY
            # Positional (outputs, parameters, error, final): keywords would build a dict
            # for the class call, once for every response.
            response = InferenceResponse(self._reader.unpack(tensors), body.parameters or {},
                                         None, body.final)
        try:
            request.stream.send_nowait(response)
        except StreamClosedError:
            log.error("instance %s: a response after the final one was dropped", self.name)
        if body.final:
            returned = self._returned
            if slot in returned:
                returned.discard(slot)
                self._release(slot)
            else:
                self._finished.add(slot)

    def _done(self, done: msg.Done) -> None:
        if done.released or done.unstarted:
            self._settle_requests(done)
        batches = self._batches
        entry = batches.pop(done.batch_id, None)
        traces = traces_of(entry.batch) if entry is not None and entry.traced else None
        if traces is not None:
            record(traces, COMPUTE_OUTPUT_START, time.monotonic_ns())
        if entry is not None:
            self._returned.update(entry.slots)  # a final response among these ends its slot
        # The responses execute returned wake when on_done says (as an instance thread's
        # do: the scheduler may hold them back to keep the dispatch order).
        woken: list[ResponseStream] = []
        wakes.deferred = woken
        try:
            for body in done.responses:
                self._deliver(body)
        finally:
            wakes.deferred = None
        if done.released:
            self._release_rescheduled(done.released)
        if batches:
            self._next_begins()
        if entry is None:
            wake_all(woken)
            return
        if traces is not None:
            record(traces, COMPUTE_END, time.monotonic_ns())
        if self._finished:
            self._release_finished(entry.slots)
        self._report(self._owner, entry.batch, done.elapsed_ns, woken)

    def _release_finished(self, slots: list[int]) -> None:
        """Of a batch whose execute returned, the slots whose final response came before."""
        finished, returned = self._finished, self._returned
        for slot in slots:
            if slot in finished:
                finished.discard(slot)
                returned.discard(slot)
                self._release(slot)

    def _release_rescheduled(self, released: list[msg.Released]) -> None:
        """A request its model released with RESCHEDULE gets no final response in this
        slot (its next execution answers it, in a slot of its own): its execute returned,
        so the slot is given back now, decoupled or not."""
        returned, finished = self._returned, self._finished
        for part in released:
            slot = part.slot
            if part.flags == RELEASE_RESCHEDULE and slot in returned:
                returned.discard(slot)
                finished.discard(slot)
                self._release(slot)

    def _settle_requests(self, done: msg.Done) -> None:
        for released in done.released:
            request = self._pending.get(released.slot)
            if request is not None:
                request.release_flags = released.flags
        for slot in done.unstarted:  # cancelled while the batch waited in the process
            request = self._pending.get(slot)
            if request is not None:
                self._finished.add(slot)
                end_unstarted(request)

    def _next_begins(self) -> None:
        """The batch after the one just done begins now (the process runs them in order)."""
        following = next(iter(self._batches.values()))
        if following.waiting:
            following.waiting = False
            if following.traced:
                _compute_started(following, time.monotonic_ns())

    def request_in(self, slot: int) -> AdmittedRequest | None:
        """The request the child holds in ``slot``, if any (BLS calls name their parent)."""
        return self._pending.get(slot)

    def _release(self, slot: int) -> None:
        self._flags.release(slot, self._pending.pop(slot).cancellation)

    # -- calls the child makes -------------------------------------------------
    def _start_call(self, call: msg.Call) -> None:
        assert self._reader is not None
        if call.call_id in self._calls:
            raise FrameError(f"call {call.call_id} was started twice")
        buffers = self._reader.unpack_buffers(call.buffers)
        parents = [self._pending[s] for s in call.parents if s in self._pending]
        context = CallContext(self, call.call_id, parents, self._send_reply,
                              Cancellation(self._loop))
        task = self._loop.create_task(self._run_call(context, call.kind, call.payload, buffers))
        self._calls[call.call_id] = (context, task)

    async def _run_call(self, context: CallContext, kind: str, payload: object,
                        buffers: list[memoryview]) -> None:
        try:
            handler = calls.HANDLERS.get(kind)
            if handler is None:
                raise TritiumError(ErrorCode.UNSUPPORTED, f"no handler for call '{kind}'")
            await handler(context, payload, buffers)
            if not context.finished:
                context.reply(None, (), True)
        except Exception as exc:
            if not context.finished and self._channel is not None:
                context.finished = True
                self._channel.send(msg.ReplyError(context.call_id, ErrorBody.of(exc)))
        finally:
            self._calls.pop(context.call_id, None)

    def _send_reply(self, call_id: int, payload: object, buffers: Sequence[Any],
                    final: bool) -> None:
        if self._channel is None or not self.alive:
            return
        assert self._writer is not None
        packed = self._writer.pack_buffers(buffers) if buffers else EMPTY
        self._channel.send(msg.Reply(call_id, payload, packed, final))

    # -- a broken or hostile child ----------------------------------------------
    def _on_broken(self, reason: str) -> None:
        """The child sent what no instance process may: it ends now (and is restarted)."""
        log.error("instance process %s (pid %s) of model '%s' is ended: %s", self.name,
                  self.pid, self.info.model_name, reason)
        self.kill()  # its exit (``_watch``) answers what it held

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
        self._release_arenas()
        settle(self._ready, TritiumError(
            ErrorCode.INTERNAL, f"instance process of '{self.name}' exited ({code}) "
            "before the model was initialized"))
        if not self._exited.done():
            self._exited.set_result(code)

    def _release_arenas(self) -> None:
        """Unmap now what nothing reads any more: the arena to the child at once, the one
        from it once the last response tensor that views it is gone (not at a cyclic GC:
        the channel's callbacks, which name this object, go with it)."""
        for arena in (self._writer, self._reader):
            if arena is not None:
                arena.close()
        self._writer = self._reader = None
        self._channel = None

    def _gone(self) -> None:
        """The child is gone: what it held fails now, every batch is reported done."""
        if not self.alive:
            return
        self.alive = False
        error = self.crash_error()
        for request in self._pending.values():
            self._fail([request], error)
        self._pending.clear()
        self._finished.clear()
        self._returned.clear()
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
