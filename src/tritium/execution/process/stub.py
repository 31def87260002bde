"""An instance process's main: ``python -m tritium.execution.process.stub``.

Receives INIT (the instance and its config), loads model.py with the python backend's own
loader, and serves EXECUTE frames until STOP. The backend runs unchanged: it is handed
requests shaped as the core's (``request``, ``cancellation``, ``stream``) whose cancel
state is a byte of shared memory and whose stream sends over the channel.
"""

from __future__ import annotations

import collections
import logging
import operator
import os
import socket
import sys
from typing import TYPE_CHECKING, Any

import msgspec

from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.request import RELEASE_ALL
from tritium.core.response import InferenceResponse, StreamClosedError, model_scope, wakes
from tritium.core.types import Tensor
from tritium.execution.backend import InstanceInfo
from tritium.execution.placement import ThreadPlacement
from tritium.execution.placement import current as current_placement
from tritium.execution.placement import install as install_placement
from tritium.execution.process import channel as ch
from tritium.execution.process import logger
from tritium.execution.process import messages as msg
from tritium.execution.process.channel import ChildLink
from tritium.execution.process.flags import FlagView, SlotCancellation
from tritium.execution.process.messages import ErrorBody
from tritium.execution.process.parking import Parking
from tritium.execution.process.shm import ArenaReader, ArenaWriter, Mapping
from tritium.execution.process.wire import TraceRef
from tritium.execution.runner import BatchRunner, run_model_loop

if TYPE_CHECKING:
    import asyncio  # imported for ``async def execute`` only: ssl and all cost ~7 MiB

log = logging.getLogger("tritium.execution.process")


# The objects made per request are msgspec Structs: built in C, with no Python __init__
# to run (what the child builds for each request costs about as much as its messages).


class ChildStream(msgspec.Struct):
    """The send half of a request's stream, in the child: sends go over the channel.

    What ``backend.execute`` delivers after the model's ``execute`` returned waits for the
    DONE frame (one frame per batch); what the model sends itself leaves at once. What a
    cancelled request sends goes too: the server's stream decides, as for a thread
    instance (a client's request drops it; a BLS child's caller still reads it).
    """

    server: InstanceServer
    slot: int
    closed: bool = False
    keeps_arrays = False  # a response is copied out (arena or frame) as it is sent

    def send_nowait(self, response: InferenceResponse) -> None:
        if self.closed:
            raise StreamClosedError()
        if response.final:
            self.closed = True
        self.server.send_response(self.slot, response)


def _from_desc(name: str) -> Any:
    """A read-only attribute that reads the request's ``RequestDesc`` (in C)."""
    return property(operator.attrgetter(f"desc.{name}"))


class ChildCore(msgspec.Struct, gc=False):
    """A request as the python backend reads it (the fields of a core ``InferenceRequest``
    it reads): the ``RequestDesc`` that came, the request's inputs and its trace. Not a
    copy: the fields the backend reads rarely are read from ``desc`` when asked."""

    desc: msg.RequestDesc
    inputs: dict[str, Tensor]
    trace: TraceRef | None = None

    id = _from_desc("id")
    model_name = _from_desc("model_name")
    correlation_id = _from_desc("correlation_id")
    flags = _from_desc("flags")
    timeout_us = _from_desc("timeout_us")
    parameters = _from_desc("parameters")

    def requested_output_names(self) -> list[str] | None:
        return self.desc.outputs

    def describe(self) -> str:
        return self.desc.id or "<id_unknown>"


class ChildRequest(msgspec.Struct):
    """What the python backend reads of an admitted request."""

    request: ChildCore
    cancellation: SlotCancellation
    stream: ChildStream
    slot: int
    release_flags: int = RELEASE_ALL  # set_release_flags; the server reads it at DONE

    def describe(self) -> str:
        return self.request.describe()


class _Batch(msgspec.Struct):
    """A batch the server sent: its id (DONE names it), its requests, and the slots of
    those cancelled while it waited here."""

    batch_id: int
    requests: list[ChildRequest]
    unstarted: list[int]


class InstanceServer:
    """Runs the batches the server sends through one backend."""

    def __init__(self, link: ChildLink, backend: Any, flags: FlagView) -> None:
        self._link = link
        self._backend = backend
        self._flags = flags
        self._writer: ArenaWriter = link.writer  # type: ignore[assignment]
        self._reader: ArenaReader = link.reader  # type: ignore[assignment]
        self._inbox: collections.deque[Any] = collections.deque()
        self._deferred: list[msg.ResponseBody] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._placement = current_placement()
        self._parking = Parking(None, frozenset())  # see park
        self._runner: BatchRunner[_Batch] = BatchRunner(
            backend, getattr(backend, "model_name", "?"), self._batch_done, self._placement)

    # -- responses -----------------------------------------------------------
    def send_response(self, slot: int, response: InferenceResponse) -> None:
        if response.flag_only:
            body = msg.ResponseBody(slot, True, True)
        elif response.error is not None:
            body = msg.ResponseBody(slot, response.final, error=ErrorBody.of(response.error))
        else:
            try:
                tensors = self._writer.pack(response.outputs)
            except TritiumError as exc:  # too large to cross: the client gets why
                body = msg.ResponseBody(slot, response.final, error=ErrorBody.of(exc))
            else:
                # Not copied: nothing changes a sent response (pb_utils copies its parameters).
                # None for none: the server decodes no empty map (it reads None as {}).
                body = msg.ResponseBody(slot, response.final, False, None,
                                        response.parameters or None, tensors)
        # The backend delivers what execute returned (not model code): it leaves with DONE.
        if wakes.deferred is not None and model_scope.get() is None:
            self._deferred.append(body)
        else:
            self._link.send(msg.Responses([body]))

    # -- batches -------------------------------------------------------------
    def _batch(self, execute: msg.Execute) -> _Batch:
        """The batch ``execute`` names, less the requests cancelled while it waited here
        (the server sends a batch before the previous one is done): a queued request
        never reaches execute once its client has gone."""
        tensors = self._reader.unpack(execute.inputs)
        requests: list[ChildRequest] = []
        unstarted: list[int] = []
        cancellation_of = self._flags.cancellation
        at = 0
        for desc in execute.requests:  # one pass: every request of a small batch crosses
            slot, count = desc.slot, desc.inputs
            cancellation = cancellation_of(slot)
            if cancellation.is_cancelled():
                unstarted.append(slot)
            else:
                inputs: dict[str, Tensor] = {}
                for tensor in tensors[at:at + count]:
                    inputs[tensor.name] = tensor
                trace = desc.trace
                core = ChildCore(desc, inputs, None if trace is None else TraceRef(trace, slot))
                requests.append(ChildRequest(core, cancellation, ChildStream(self, slot), slot))
            at += count
        return _Batch(execute.batch_id, requests, unstarted)

    def serve(self) -> None:
        """Synchronous models: this thread reads the socket between batches."""
        self._link.on_frame = self._inbox.append
        inbox = self._inbox
        self._placement.settle()
        waiting = inbox.__len__  # a C call: the loop's check costs no Python frame
        while True:
            if not inbox:
                try:
                    self._link.wait_until(waiting)
                except EOFError:
                    self._server_gone()
            message = inbox.popleft()
            if type(message) is msg.Execute:
                if inbox and self._parking.parked:
                    self._parking.unpark()
                batch = self._batch(message)
                self._runner.run(batch, batch.requests)
            elif type(message) is msg.Stop:
                return
            elif message is msg.GONE:
                self._server_gone()

    def park(self, home: int | None) -> None:
        """Wait for short batches that come one at a time on the loop's core ``home``
        (parking.py); decoupled models and ``async def execute`` never do."""
        if not (self._backend.decoupled or self._backend.is_async):
            self._parking = Parking(home, self._placement.everywhere)

    def _batch_done(self, batch: _Batch, elapsed: int, woken: object) -> None:
        if self._parking.active:
            self._parking.batch_done(elapsed, bool(self._inbox))
        # What execute delivered after the model's own sends leaves with DONE, one frame.
        deferred, self._deferred = self._deferred, []
        released: list[msg.Released] = []  # the release flags models set (RESCHEDULE), by slot
        for request in batch.requests:
            if request.release_flags != RELEASE_ALL:
                released.append(msg.Released(request.slot, request.release_flags))
        self._link.send(msg.Done(batch.batch_id, elapsed, deferred, released, batch.unstarted))

    # -- async def execute ---------------------------------------------------
    def serve_async(self) -> None:
        """``async def execute``: this thread runs the model's loop, a thread reads."""
        import asyncio

        loop = self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)

        def on_frame(message: Any) -> None:
            loop.call_soon_threadsafe(self._on_async, message)

        self._link.on_frame = on_frame
        reader = _thread(self._link.serve_forever, "tritium-link-reader")
        reader.start()
        run_model_loop(loop)

    def _on_async(self, message: Any) -> None:
        if type(message) is msg.Execute:
            batch = self._batch(message)
            self._runner.start_async(batch, batch.requests)
        elif type(message) is msg.Stop:
            assert self._loop is not None
            self._loop.stop()
        elif message is msg.GONE:
            self._server_gone()

    @staticmethod
    def _server_gone() -> None:
        from tritium.execution.process import death

        death.parent_gone()


def _thread(target: Any, name: str) -> Any:
    import threading

    return threading.Thread(target=target, name=name, daemon=True)


# -- main --------------------------------------------------------------------------
def _first_message(link: ChildLink) -> Any:
    messages: list[Any] = []
    link.on_frame = messages.append
    link.wait_until(lambda: bool(messages))
    return messages[0]


def _load(link: ChildLink, info: InstanceInfo, config: Any, remote: Any) -> Any:
    from tritium.backends.python.errors import describe_exception
    from tritium.backends.python.loader import create_python_backend
    try:
        # No server in this process: model code reaches it over the channel.
        return create_python_backend(info, config, remote)
    except TritiumError as exc:
        link.send(msg.InitFailed(ErrorBody.of(exc)))
    except BaseException as exc:
        link.send(msg.InitFailed(ErrorBody(ErrorCode.INTERNAL.name, describe_exception(exc))))
    return None


def main() -> int:
    fds = ch.parse_fds(os.environ.pop(ch.FDS_ENV))
    sock_fd, down_fd, up_fd, flags_fd = fds["link"], fds["in"], fds["out"], fds["flags"]
    link = ChildLink(socket.socket(fileno=sock_fd))
    try:
        init = _first_message(link)
    except EOFError:
        return 1
    if type(init) is not msg.Init:
        return 1
    info, capacity = init.info, init.arena_bytes
    version_dir = os.path.join(info.model_repository, str(info.model_version))
    from tritium.execution.process import death

    link.writer = ArenaWriter(Mapping(up_fd, capacity), init.ring_bytes)
    link.reader = ArenaReader(Mapping(down_fd, capacity))
    flags = FlagView(flags_fd, init.slots)
    for fd in (up_fd, down_fd, flags_fd):
        os.close(fd)  # mapped: the mappings stay, and forks of the model inherit nothing
    death.become_instance_process(version_dir, info.model_repository, [sock_fd])
    link.parent_slots = _parent_slots
    import json

    config = json.loads(info.config_json)  # read as Declared.of reads a dict
    logger.forward_logs(link)
    # Not settled on the loop's home core as an instance thread is (that rule exists because
    # a thread shares the loop's GIL, which a process does not): a process kept there stays
    # there when execute widens it (a running thread is not migrated at once), so two
    # instances of one model ran on one core (0.97x of one). It parks there only while short
    # batches come one at a time (parking.py).
    placement = ThreadPlacement(None, frozenset(init.cores))
    install_placement(placement)
    placement.release()
    from tritium.execution.process import forked
    from tritium.execution.process.remote import RemoteLink

    remote = RemoteLink(link)
    forked.install(link, remote.rebind)  # BLS from the model's multiprocessing workers
    backend = _load(link, info, config, remote)
    if backend is None:
        return 0
    server = InstanceServer(link, backend, flags)
    server.park(init.home)
    _release_free_heap()
    link.send(msg.Ready(backend.decoupled, backend.is_async, os.getpid()))
    if backend.is_async:
        server.serve_async()
    else:
        server.serve()
    backend.finalize()
    link.send(msg.Stopped())
    return 0


def _release_free_heap() -> None:
    """Hand back the heap pages that imports and ``initialize`` used and freed (glibc
    keeps them otherwise): ~0.8 MiB of an idle instance process's RSS."""
    import ctypes

    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)


def _parent_slots() -> list[int]:
    """The slots of the requests the calling code is executing (BLS parents)."""
    from tritium.backends.python import scope

    return [getattr(request, "slot", -1) for request in scope.current_parents()]


if __name__ == "__main__":
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(main())
