"""The messages between the server and an instance process, by name.

Every frame on an instance's channel is one of these (codec.py encodes and checks them);
tensors travel in the shared-memory arenas (shm.py) and a message names their block with
a ``Packed``. Errors cross in one shape, ``ErrorBody``.

They are msgspec structs: built, encoded and checked against these annotations in C, as
arrays of their fields (a message's first item is its tag). A small request's messages,
both ways and both sides, cost a few microseconds less than as dataclasses checked in
Python, which is much of what one request at a time costs beyond a thread instance.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import msgspec

from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.request import ParamValue
from tritium.execution.backend import InstanceInfo


class Part(msgspec.Struct, array_like=True, gc=False, forbid_unknown_fields=True):
    """What crosses: an array of its fields. Never in a reference cycle, so the cyclic
    collector need not track one (``gc=False``)."""


# -- parts ----------------------------------------------------------------------------

Count = Annotated[int, msgspec.Meta(ge=0)]  # a size, dimension or place: never negative

if TYPE_CHECKING:
    InlineBytes = memoryview | bytes  # a sender may hand bytes: encoded alike
else:
    InlineBytes = memoryview  # what decoding makes: a view of the frame



class TensorDesc(Part):
    """One tensor: where its bytes are relative to its block's data, or the bytes themselves
    (``data``) when its message carries them inline."""

    name: str
    datatype: int  # DataType.code
    shape: tuple[Count, ...]
    at: Count
    nbytes: Count
    data: InlineBytes | None = None  # decoded as a view of the frame: no copy


class Packed(Part):
    """Tensors of one message: a block of the sender's arena (``offset``), or -1 when they
    travel inline, each in its ``TensorDesc.data`` (small ones, or when no block had room)."""

    offset: int
    tensors: list[TensorDesc]


EMPTY = Packed(-1, [])


class ErrorBody(Part):
    """An error as it crosses: the server's error code by name, and its text."""

    code: str
    message: str

    @staticmethod
    def of(exc: BaseException) -> ErrorBody:
        if isinstance(exc, TritiumError):
            return ErrorBody(exc.code.name, exc.message)
        return ErrorBody(ErrorCode.INTERNAL.name, f"{type(exc).__name__}: {exc}")

    def error(self) -> TritiumError:
        code = ErrorCode.__members__.get(self.code, ErrorCode.INTERNAL)
        return TritiumError(code, self.message)


class RequestDesc(Part):
    """One request of a batch, without its tensors (``inputs`` of the batch's Packed)."""

    slot: int  # its cancel flag, and how responses name it
    id: str
    correlation_id: int | str
    flags: int
    timeout_us: int
    parameters: dict[str, Any]
    outputs: list[str] | None
    model_name: str
    inputs: int  # how many of the batch's tensors are its inputs, in order
    trace: str | None = None  # traced: its W3C context ("" outside OpenTelemetry mode)


class ResponseBody(Part):
    """One response to the request in ``slot``."""

    slot: int
    final: bool
    flag_only: bool = False
    error: ErrorBody | None = None
    parameters: dict[str, Any] | None = None
    tensors: Packed | None = None


class Released(Part):
    """The release flags a model set for the request in ``slot`` (RESCHEDULE)."""

    slot: int
    flags: int


# -- the payloads of calls (calls.py names the kinds) ---------------------------------


class TensorHeader(Part):
    """A BLS tensor: its bytes are the call's buffer at the same position."""

    name: str
    datatype: str  # as the protocol spells it ("FP32")
    shape: tuple[int, ...]


class BlsRequest(Part):
    """A child request model code sends (``bls.exec``, ``bls.stream``)."""

    model_name: str
    model_version: int | None
    id: str
    inputs: list[TensorHeader]
    outputs: list[str] | None  # the requested output names; None: all of them
    parameters: dict[str, ParamValue]
    correlation_id: int | str
    flags: int
    timeout_us: int
    trace_slot: int | None  # the slot of the request whose trace it nests under


class BlsResponse(Part):
    """One response to a child request, as the server sends it back."""

    outputs: list[TensorHeader]
    parameters: dict[str, Any]
    error: ErrorBody | None
    final: bool
    flag_only: bool


class ModelCall(Part):
    """``load_model`` / ``unload_model``: the model and its parameters."""

    name: str
    parameters: dict[str, Any]


class ModelReadyCall(Part):
    name: str
    version: int | None


class FamilyCall(Part):
    """Register (or find) a metric family; answered with a ``FamilyRegistered``."""

    name: str
    description: str
    kind: int  # MetricKind


class FamilyRegistered(Part):
    kind: int  # MetricKind, as the family was first registered
    description: str


class SeriesCall(Part):
    family: str
    labels: dict[str, str]
    bounds: list[float]  # a histogram's buckets


class MetricUpdate(Part):
    """An operation on one series: add, set, observe (unanswered) or get (its value)."""

    family: str
    labels: dict[str, str]
    operation: str
    value: float


class SnapshotCall(Part):
    """A family's snapshot, or one series' (``labels`` not None)."""

    family: str
    labels: dict[str, str] | None


class LogRecordBody(Part):
    """A log record of the instance process, formatted: what formatters read of it."""

    name: str
    levelno: int
    levelname: str
    msg: str
    pathname: str
    filename: str
    module: str
    lineno: int
    funcName: str | None  # camelCase: the LogRecord attributes
    created: float
    msecs: float
    relativeCreated: float
    thread: int | None
    threadName: str | None
    process: int | None
    processName: str | None
    stack_info: str | None
    exc_text: str | None


class CompletedConfig(Part):
    """What ``auto_complete_config``'s own process answers (autocomplete.py): the completed
    ModelConfig (protobuf bytes), or why there is none."""

    config: bytes | None
    error: ErrorBody | None


# -- server -> instance process --------------------------------------------------------


class Init(Part, tag=1):
    info: InstanceInfo  # its config_json is all the child reads of the config: no protobuf
    arena_bytes: int
    ring_bytes: int
    slots: int
    cores: list[int]  # where model code may run (empty: anywhere)
    home: int | None = None  # the core of the server's event loop (None: not placed)


class Execute(Part, tag=2):
    batch_id: int
    requests: list[RequestDesc]
    inputs: Packed


class Stop(Part, tag=3):
    pass


class Reply(Part, tag=4):
    """One answer to a call; the last one is ``final``."""

    call_id: int
    payload: Any
    buffers: Packed
    final: bool


class ReplyError(Part, tag=5):
    call_id: int
    error: ErrorBody


# -- instance process -> server --------------------------------------------------------


class Ready(Part, tag=10):
    decoupled: bool
    is_async: bool
    pid: int  # the instance process's own (the server started its guardian)


class InitFailed(Part, tag=11):
    error: ErrorBody


class Responses(Part, tag=12):
    """Responses a model sent itself, as it sent them."""

    items: list[ResponseBody]


class Done(Part, tag=13):
    """A batch's execute returned, with the responses it returned; ``unstarted``: the
    slots of its requests cancelled before it began (they never reached execute)."""

    batch_id: int
    elapsed_ns: int
    responses: list[ResponseBody]
    released: list[Released]
    unstarted: list[int]


class Call(Part, tag=14):
    """Model code asks the server something (calls.py names the kinds)."""

    call_id: int
    kind: str
    payload: Any
    buffers: Packed
    parents: list[int]  # the slots of the requests it was made for


class CallCancel(Part, tag=15):
    call_id: int


class Stopped(Part, tag=16):
    pass


class Gone(Part):
    """Not on the wire: what the child's link hands on when the server's end closes."""


GONE = Gone()

# What a frame may hold: the codec decodes a frame as exactly one of these, by its tag.
ON_THE_WIRE = (Init, Execute, Stop, Reply, ReplyError, Ready, InitFailed, Responses, Done, Call,
               CallCancel, Stopped)
