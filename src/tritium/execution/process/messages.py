"""The messages between the server and an instance process, by name.

Every frame on an instance's channel is one of these (codec.py encodes and checks them);
tensors travel in the shared-memory arenas (shm.py) and a message names their block with
a ``Packed``. Errors cross in one shape, ``ErrorBody``.

They are not frozen, though nothing changes one once built: a frozen dataclass sets each
field through ``object.__setattr__``, and building the messages of one small request
(both ways, both sides) then cost more than checking them (a ten-field ``RequestDesc``:
1.1 µs frozen, 0.3 µs not).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.request import ParamValue
from tritium.execution.backend import InstanceInfo
from tritium.execution.process.codec import message

# -- parts ----------------------------------------------------------------------------


@dataclass(slots=True)
class TensorDesc:
    """One tensor of a block: where its bytes are, relative to the block's data."""

    name: str
    datatype: int  # DataType.code
    shape: tuple[int, ...]
    at: int
    nbytes: int


@dataclass(slots=True)
class Packed:
    """Tensors of one message: a block of the sender's arena, or inline bytes when no
    block had room (``offset`` -1)."""

    offset: int
    tensors: list[TensorDesc]
    inline: bytes | None = None


EMPTY = Packed(-1, [])


@dataclass(slots=True)
class ErrorBody:
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


@dataclass(slots=True)
class RequestDesc:
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


@dataclass(slots=True)
class ResponseBody:
    """One response to the request in ``slot``."""

    slot: int
    final: bool
    flag_only: bool = False
    error: ErrorBody | None = None
    parameters: dict[str, Any] | None = None
    tensors: Packed | None = None


@dataclass(slots=True)
class Released:
    """The release flags a model set for the request in ``slot`` (RESCHEDULE)."""

    slot: int
    flags: int


# -- the payloads of calls (calls.py names the kinds) ---------------------------------


@dataclass(slots=True)
class TensorHeader:
    """A BLS tensor: its bytes are the call's buffer at the same position."""

    name: str
    datatype: str  # as the protocol spells it ("FP32")
    shape: tuple[int, ...]


@dataclass(slots=True)
class BlsRequest:
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


@dataclass(slots=True)
class BlsResponse:
    """One response to a child request, as the server sends it back."""

    outputs: list[TensorHeader]
    parameters: dict[str, Any]
    error: ErrorBody | None
    final: bool
    flag_only: bool


@dataclass(slots=True)
class ModelCall:
    """``load_model`` / ``unload_model``: the model and its parameters."""

    name: str
    parameters: dict[str, Any]


@dataclass(slots=True)
class ModelReadyCall:
    name: str
    version: int | None


@dataclass(slots=True)
class FamilyCall:
    """Register (or find) a metric family; answered with a ``FamilyRegistered``."""

    name: str
    description: str
    kind: int  # MetricKind


@dataclass(slots=True)
class FamilyRegistered:
    kind: int  # MetricKind, as the family was first registered
    description: str


@dataclass(slots=True)
class SeriesCall:
    family: str
    labels: dict[str, str]
    bounds: list[float]  # a histogram's buckets


@dataclass(slots=True)
class MetricUpdate:
    """An operation on one series: add, set, observe (unanswered) or get (its value)."""

    family: str
    labels: dict[str, str]
    operation: str
    value: float


@dataclass(slots=True)
class SnapshotCall:
    """A family's snapshot, or one series' (``labels`` not None)."""

    family: str
    labels: dict[str, str] | None


@dataclass(slots=True)
class LogRecordBody:
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


@dataclass(slots=True)
class CompletedConfig:
    """What ``auto_complete_config``'s own process answers (autocomplete.py): the completed
    ModelConfig (protobuf bytes), or why there is none."""

    config: bytes | None
    error: ErrorBody | None


# -- server -> instance process --------------------------------------------------------


@message(1)
@dataclass(slots=True)
class Init:
    info: InstanceInfo  # its config_json is all the child reads of the config: no protobuf
    arena_bytes: int
    ring_bytes: int
    slots: int
    cores: list[int]  # where model code may run (empty: anywhere)


@message(2)
@dataclass(slots=True)
class Execute:
    batch_id: int
    requests: list[RequestDesc]
    inputs: Packed


@message(3)
@dataclass(slots=True)
class Stop:
    pass


@message(4)
@dataclass(slots=True)
class Reply:
    """One answer to a call; the last one is ``final``."""

    call_id: int
    payload: Any
    buffers: Packed
    final: bool


@message(5)
@dataclass(slots=True)
class ReplyError:
    call_id: int
    error: ErrorBody


# -- instance process -> server --------------------------------------------------------


@message(10)
@dataclass(slots=True)
class Ready:
    decoupled: bool
    is_async: bool
    pid: int  # the instance process's own (the server started its guardian)


@message(11)
@dataclass(slots=True)
class InitFailed:
    error: ErrorBody


@message(12)
@dataclass(slots=True)
class Responses:
    """Responses a model sent itself, as it sent them."""

    items: list[ResponseBody]


@message(13)
@dataclass(slots=True)
class Done:
    """A batch's execute returned, with the responses it returned; ``unstarted``: the
    slots of its requests cancelled before it began (they never reached execute)."""

    batch_id: int
    elapsed_ns: int
    responses: list[ResponseBody]
    released: list[Released]
    unstarted: list[int]


@message(14)
@dataclass(slots=True)
class Call:
    """Model code asks the server something (calls.py names the kinds)."""

    call_id: int
    kind: str
    payload: Any
    buffers: Packed
    parents: list[int]  # the slots of the requests it was made for


@message(15)
@dataclass(slots=True)
class CallCancel:
    call_id: int


@message(16)
@dataclass(slots=True)
class Stopped:
    pass


@dataclass(slots=True)
class Gone:
    """Not on the wire: what the child's link hands on when the server's end closes."""


GONE = Gone()
