"""gRPC infer codec: tritonclient's protobuf messages to core objects and back."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence, Sized
from dataclasses import dataclass
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from tritium.core import messages
from tritium.core.classification import classify
from tritium.core.errors import ErrorCode, TritiumError, invalid
from tritium.core.logging_settings import (
    LIST_TRACE_SETTINGS,
    LOG_SETTING_TYPES,
    LogValue,
    TraceValue,
)
from tritium.core.model import IndexEntry, ModelHandle, ModelMetadata, TensorMetadata
from tritium.core.parameters import (
    ValueNames,
    apply_known_parameter,
    parse_bool,
    parse_unsigned,
    refuse_reserved,
)
from tritium.core.request import InferenceRequest, ParamValue, RequestedOutput
from tritium.core.response import InferenceResponse
from tritium.core.serialization import SLICE, array_from_binary, bytes_array, tensor_bytes
from tritium.core.service import ModelStatisticsEntry
from tritium.core.shared_memory import SharedMemoryRegistry, Slice
from tritium.core.statistics import Duration, ModelStatistics
from tritium.core.types import BYTES, DataType, Tensor
from tritium.core.validation import check_input, element_count
from tritium.frontends.grpc import shared_memory as shm

_from_wire = DataType.from_wire

FINAL_KEY = "triton_final_response"
EMPTY_FINAL_KEY = "triton_enable_empty_final_response"
_INT64_MAX = (1 << 63) - 1


@dataclass(slots=True)
class GrpcRequestState:
    """What the gRPC request said that only the gRPC encoder needs (``frontend_state``)."""

    version_text: str = ""  # model_version exactly as the client sent it
    empty_final: bool = False  # write a response for a flag-only FINAL
    # Outputs to write into shared memory regions instead of the response, by name.
    shm_outputs: dict[str, Slice] | None = None


def parse_version(text: str) -> int | None:
    """A ``model_version`` string: empty means the version policy picks."""
    if not text:
        return None
    if not text.isdigit():
        raise invalid(f"invalid model version '{text}'")
    return int(text)


# --------------------------------------------------------------------------- request


def decode_infer_request(
    message: pb.ModelInferRequest, model: ModelHandle | None = None,
    shared_memory: SharedMemoryRegistry | None = None,
) -> InferenceRequest:
    """A core request from a ModelInferRequest.

    With ``model``, each input is checked against its configuration (declared, datatype,
    shape, batch size, byte size) before any input's data is decoded. Tensors whose
    parameters name a ``shared_memory`` region are read from (outputs: written to) it.
    """
    request = decode_small_request(message, model, shared_memory, math.inf)
    assert request is not None  # no limit: never deferred
    return request


def decode_small_request(
    message: pb.ModelInferRequest, model: ModelHandle | None,
    shared_memory: SharedMemoryRegistry | None, limit: float,
) -> InferenceRequest | None:
    """``decode_infer_request``, or None once its inputs claim to take more than ``limit``
    bytes to decode, before the data of the input that passed it is read: such a request
    is decoded again, in full, off the event loop. What the inputs before it raise is what
    that decode would raise first, so the answer is the same either way.

    An input claims its element count times its itemsize (BYTES: 4), and typed contents 8
    more per value (converted only once every input is checked): each read of a raw
    contents field copies it, and a claim too small is refused before long."""
    # Each read of a message field is a lookup by name in C: every field is read once.
    version_text = message.model_version
    params = message.parameters
    outputs = message.outputs
    # The usual request names no version, parameters or outputs: it has no state to keep.
    state = GrpcRequestState(version_text) if version_text or params or outputs else None
    # Positional (model_name, inputs, model_version, id): keywords would build a dict for
    # the class call, on every request.
    request = InferenceRequest(message.model_name, {},
                               parse_version(version_text) if version_text else None,
                               message.id)
    request.frontend_state = state
    if state is not None and params:
        _apply_parameters(request, state, params)
    raw = message.raw_input_contents
    # Repeated fields are sliced, not iterated: their iteration ends on an IndexError,
    # which costs more than the rest of the loop over them.
    items = message.inputs[:]
    if raw and len(raw) != len(items):
        _check_raw_count(len(raw), items, request.id)
    try:
        _decode_inputs(message, items, raw, request, model, shared_memory, limit)
    except _Deferred:
        return None
    if state is not None and outputs:
        request.requested_outputs = [_decode_output(output, state, shared_memory)
                                     for output in outputs[:]]
    request.checked_for = model  # every input passed check_input for it (see _decode_inputs)
    return request


class _Deferred(Exception):
    """The inputs claimed more bytes than a decode on the event loop may take."""


# What an element of each datatype claims (see decode_small_request).
_CLAIMED_ITEMSIZE = {datatype: datatype.itemsize or 4 for datatype in DataType}


# An input checked whose data may still fail to decode (BYTES, typed contents): name,
# datatype, shape, element count, and its raw bytes or (raw None) its typed values.
_Pending = tuple[str, DataType, tuple[int, ...], int, "bytes | bytearray | memoryview | None",
                 "Sequence[Any] | None"]


def _decode_inputs(
    message: pb.ModelInferRequest, items: list[Any], raw: Sequence[bytes],
    request: InferenceRequest, model: ModelHandle | None,
    shared_memory: SharedMemoryRegistry | None, limit: float,
) -> None:
    """Every input checked (against ``model`` too, when given), then decoded into
    ``request.inputs`` in the message's order; _Deferred once they claim over ``limit``.

    Fixed-size raw data cannot fail to decode once its size is checked, so it becomes a
    tensor at once; data that can (BYTES, typed contents) waits until every input passed."""
    request_id = request.id
    inputs = request.inputs
    pending: list[_Pending] = []
    next_raw = 0
    claimed = 0
    data: bytes | bytearray | memoryview
    for item in items:
        name = item.name
        if name in inputs:
            raise invalid(f"{_prefix(request_id)}input '{name}' is given more than once")
        region = (shm.input_slice(item, message.model_name, shared_memory) if item.parameters
                  else None)
        wire = item.datatype
        datatype = _from_wire(wire)
        if datatype is None:
            raise invalid(f"invalid datatype '{wire}' for input '{name}'")
        shape = tuple(item.shape[:])
        if min(shape, default=0) < 0:  # one C call, not a Python loop over the dimensions
            raise invalid(f"input '{name}' has a negative dimension in shape {list(shape)}")
        count = element_count(name, shape, request_id)
        if model is not None:
            check_input(model, name, datatype, shape, request_id)
        claimed += count * _CLAIMED_ITEMSIZE[datatype]
        if claimed > limit:
            raise _Deferred
        if region is not None:
            claimed = _region_claimed(region, claimed, count * _CLAIMED_ITEMSIZE[datatype],
                                      limit)
            _check_raw_size(name, datatype, shape, count, region)  # before anything is read
            data = region.read()
        elif raw:
            if item.HasField("contents"):
                raise invalid(
                    f"{_prefix(request_id)}contents field must not be specified when using "
                    f"raw_input_contents for input '{name}' for model '{message.model_name}'"
                )
            data = raw[next_raw]  # a copy each time it is read (a lifted entry: a view)
            next_raw += 1
        else:
            values = _typed_values(name, datatype, shape, count, item.contents)
            claimed += 8 * count  # checked before any is converted (_decode_pending)
            pending.append((name, datatype, shape, count, None, values))
            inputs[name] = _UNDECODED  # holds the input's place in the order
            continue
        if datatype is not BYTES and len(data) == count * datatype.itemsize:
            inputs[name] = Tensor(name, datatype, shape,
                                  np.frombuffer(data, dtype=datatype.numpy).reshape(shape))
        else:
            _check_raw_size(name, datatype, shape, count, data)  # raises, unless BYTES
            pending.append((name, datatype, shape, count, data, None))
            inputs[name] = _UNDECODED
    if pending:
        _decode_pending(inputs, pending, limit - claimed)


def _region_claimed(region: Sized, claimed: int, claim: int, limit: float) -> int:
    """``claimed`` with a region's bytes in place of its input's ``claim``: they are read
    whole whatever the shape says (BYTES)."""
    claimed += max(0, len(region) - claim)
    if claimed > limit:
        raise _Deferred
    return claimed


def _check_raw_count(given: int, items: list[Any], request_id: str) -> None:
    # Inputs in shared memory have no raw entry: the others take theirs in order.
    expected = _raw_count(items)
    if given != expected:
        raise invalid(
            f"{_prefix(request_id)}expected {expected} entries in "
            f"raw_input_contents, one per input, but got {given}"
        )


def _decode_pending(inputs: dict[str, Tensor], pending: list[_Pending], room: float) -> None:
    if room < 0:  # typed contents claimed too much
        raise _Deferred
    for name, datatype, shape, count, data, values in pending:
        if data is None:
            assert values is not None
            inputs[name] = _tensor_from_values(name, datatype, shape, values)
        else:
            inputs[name] = _tensor_from_checked_raw(name, datatype, shape, count, data)


# The place of an input decoded once every input is checked (replaced before return).
_UNDECODED = Tensor("", DataType.BYTES, (), np.empty(0, dtype=object))


def _prefix(request_id: str) -> str:
    return f"[request id: {request_id or '<id_unknown>'}] "


def tensor_from_raw(name: str, datatype: DataType, shape: tuple[int, ...], raw: bytes) -> Tensor:
    """A tensor viewing ``raw`` (row-major little-endian, or length-prefixed BYTES)."""
    count = element_count(name, shape)
    _check_raw_size(name, datatype, shape, count, raw)
    return _tensor_from_checked_raw(name, datatype, shape, count, raw)


def _tensor_from_checked_raw(name: str, datatype: DataType, shape: tuple[int, ...], count: int,
                             raw: bytes | bytearray | memoryview) -> Tensor:
    data = array_from_binary(raw, datatype, count, f"for input '{name}'")
    return Tensor(name, datatype, shape, data.reshape(shape))


def _check_raw_size(name: str, datatype: DataType, shape: tuple[int, ...], count: int,
                    raw: Sized) -> None:
    expected = count * datatype.itemsize
    if datatype is not BYTES and len(raw) != expected:
        raise invalid(
            f"input byte size mismatch for input '{name}': expected {expected} bytes "
            f"for shape {list(shape)}, got {len(raw)}"
        )


# The typed ``contents`` field for each datatype; FP16 and BF16 have none (raw only).
_TYPED_FIELDS: dict[DataType, str] = {
    DataType.BOOL: "bool_contents",
    DataType.INT8: "int_contents",
    DataType.INT16: "int_contents",
    DataType.INT32: "int_contents",
    DataType.INT64: "int64_contents",
    DataType.UINT8: "uint_contents",
    DataType.UINT16: "uint_contents",
    DataType.UINT32: "uint_contents",
    DataType.UINT64: "uint64_contents",
    DataType.FP32: "fp32_contents",
    DataType.FP64: "fp64_contents",
    DataType.BYTES: "bytes_contents",
}


def tensor_from_contents(
    name: str, datatype: DataType, shape: tuple[int, ...], contents: pb.InferTensorContents
) -> Tensor:
    """A tensor from the typed ``contents`` field that matches ``datatype``."""
    values = _typed_values(name, datatype, shape, element_count(name, shape), contents)
    return _tensor_from_values(name, datatype, shape, values)


def _typed_values(name: str, datatype: DataType, shape: tuple[int, ...], count: int,
                  contents: pb.InferTensorContents) -> Sequence[Any]:
    field = _TYPED_FIELDS.get(datatype)
    if field is None:
        raise invalid(
            f"{datatype.wire} input '{name}' must be sent in raw_input_contents: "
            "the typed contents have no field for it"
        )
    values: Sequence[Any] = getattr(contents, field)
    if len(values) != count:
        raise invalid(
            f"expected {count} elements in {field} for input '{name}' of shape "
            f"{list(shape)}, got {len(values)}"
        )
    return values


def _tensor_from_values(name: str, datatype: DataType, shape: tuple[int, ...],
                        values: Sequence[Any]) -> Tensor:
    if len(values) <= SLICE:
        data = _typed_array(name, datatype, values)
    else:
        # A slice at a time: converting a repeated field holds the GIL throughout.
        data = np.empty(len(values), dtype=datatype.numpy)
        for start in range(0, len(values), SLICE):
            data[start : start + SLICE] = _typed_array(
                name, datatype, values[start : start + SLICE])
    return Tensor(name, datatype, shape, data.reshape(shape))


def _typed_array(name: str, datatype: DataType, values: Sequence[Any]) -> np.ndarray:
    if datatype is BYTES:
        return bytes_array(list(values))
    wide = np.array(values, dtype=_WIDE.get(datatype, datatype.numpy))
    if datatype not in _WIDE:
        return wide
    info = np.iinfo(datatype.numpy)
    if wide.size and (wide.min() < info.min or wide.max() > info.max):
        raise invalid(f"a value of input '{name}' is out of range for {datatype.wire}")
    return wide.astype(datatype.numpy)


# Narrow integers travel in 32-bit fields; they are range-checked before narrowing.
_WIDE = {
    DataType.INT8: np.dtype(np.int32),
    DataType.INT16: np.dtype(np.int32),
    DataType.UINT8: np.dtype(np.uint32),
    DataType.UINT16: np.dtype(np.uint32),
}


def _raw_count(items: Iterable[Any]) -> int:
    """How many of ``items`` take an entry of raw_input_contents (those not in shm)."""
    return sum(1 for item in items if shm.REGION not in item.parameters)


def _decode_output(item: pb.ModelInferRequest.InferRequestedOutputTensor,
                   state: GrpcRequestState, shared_memory: SharedMemoryRegistry | None
                   ) -> RequestedOutput:
    if not item.parameters:
        return RequestedOutput(item.name)
    region = shm.output_slice(item, shared_memory)
    if region is not None:
        if state.shm_outputs is None:
            state.shm_outputs = {}
        state.shm_outputs[item.name] = region
    params = {key: parameter_value(key, value) for key, value in item.parameters.items()}
    if "classification" in params:
        parse_unsigned("classification", params["classification"], _PROTO_NAMES)
    return RequestedOutput(item.name, params)


# ------------------------------------------------------------------ request parameters


def parameter_value(key: str, value: pb.InferParameter) -> ParamValue:
    """The Python value of one InferParameter; an unset one is refused."""
    result = _oneof_value(value)
    if result is None:
        raise invalid(f"parameter '{key}' has no value")
    return result


def _oneof_value(param: pb.InferParameter) -> ParamValue | None:
    kind = param.WhichOneof("parameter_choice")
    return None if kind is None else getattr(param, kind)


# Messages name the protobuf fields a client should have set, per key as Triton's
# infer_handler.cc does.
_PROTO_NAMES = ValueNames(
    unsigned=messages.PROTO_WRONG_TYPE, boolean=messages.PROTO_NOT_BOOL,
    string=messages.PROTO_WRONG_TYPE, negative=messages.PROTO_NEGATIVE,
    expected={"sequence_id": "int64_param or string_param",
              "priority": "int64_param or uint64_param", "timeout": "int64_param",
              "classification": "int64_param"})


def _apply_parameters(request: InferenceRequest, state: GrpcRequestState, params: Any) -> None:
    for key, param in params.items():
        value = _oneof_value(param)
        if key == EMPTY_FINAL_KEY:
            state.empty_final = parse_bool(key, value, _PROTO_NAMES)
        elif not apply_known_parameter(request, key, value, _PROTO_NAMES):
            request.parameters[key] = _model_parameter(key, param)


_RESERVED_TEXT = messages.RESERVED_PREFIX_GRPC.format(allowed=EMPTY_FINAL_KEY)


def _model_parameter(key: str, param: pb.InferParameter) -> ParamValue:
    refuse_reserved(key, prefix_text=_RESERVED_TEXT)
    kind = param.WhichOneof("parameter_choice")
    if kind is None or kind == "uint64_param":
        raise invalid(messages.PROTO_MODEL_PARAMETER_TYPE.format(key=key))
    result: ParamValue = getattr(param, kind)
    return result


# -------------------------------------------------------------------------- response


def infer_response_message(
    response: InferenceResponse, request: InferenceRequest
) -> pb.ModelInferResponse:
    """A ModelInferResponse with every output in ``raw_output_contents``.

    An output requested with a ``classification`` count is sent as its top classes (BYTES),
    using what the response's ``served_by`` says: ``batched`` and ``labels``.
    """
    message, raws = _response_without_contents(response, request)
    message.raw_output_contents.extend(bytes(raw) for raw in raws)
    return message


def encode_infer_response(
    response: InferenceResponse, request: InferenceRequest
) -> list[bytes | memoryview]:
    """``infer_response_message(...).SerializeToString()``, in pieces that view the output
    tensors instead of copying them: through the message, a tensor is copied three times
    (into bytes, into the message, into its serialization) before the socket copies it."""
    message, raws = _response_without_contents(response, request)
    pieces: list[bytes | memoryview] = [message.SerializeToString()]
    for raw in raws:
        # Field 6 (raw_output_contents), length-delimited: the protobuf wire format puts it
        # after fields 1-5, exactly where the message's own serialization would.
        pieces += (_RAW_OUTPUT_KEYS[len(raw)], raw)
    return pieces


_RAW_OUTPUT_KEY = bytes(((6 << 3) | 2,))


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class _RawOutputKeys(dict[int, bytes]):
    """Field 6's key and a length, by the length: those of up to 4 KiB (the usual reply's)
    are encoded once, so that a lookup runs no Python; longer ones on each use."""

    def __missing__(self, size: int) -> bytes:
        return _RAW_OUTPUT_KEY + _varint(size)


_RAW_OUTPUT_KEYS = _RawOutputKeys((size, _RAW_OUTPUT_KEY + _varint(size)) for size in range(4096))


def _response_without_contents(
    response: InferenceResponse, request: InferenceRequest
) -> tuple[pb.ModelInferResponse, list[bytes | memoryview]]:
    served = response.served_by
    message = pb.ModelInferResponse(
        model_name=request.model_name,
        model_version="" if served is None else str(served.version),
        id=request.id,
    )
    outputs = message.outputs
    raws: list[bytes | memoryview] = []
    if request.frontend_state is None and request.requested_outputs is None:
        # The usual reply (see decode_infer_request): every output, none in shared memory.
        for tensor in response.outputs:
            outputs.add(name=tensor.name, datatype=tensor.datatype.wire, shape=tensor.shape)
            raws.append(_raw_output(tensor))
    else:
        _add_chosen_outputs(response, request, outputs, raws)
    if response.parameters:
        set_parameters(message.parameters, response.parameters)
    return message, raws


def _add_chosen_outputs(response: InferenceResponse, request: InferenceRequest, outputs: Any,
                        raws: list[bytes | memoryview]) -> None:
    """The outputs requested (their top classes, where a classification is asked for), or
    all; those bound to a shared memory region are written there, their raw entry empty."""
    served = response.served_by
    wanted = None if request.requested_outputs is None else _class_counts(request)
    state = request.frontend_state
    in_shm = state.shm_outputs if isinstance(state, GrpcRequestState) else None
    for tensor in response.outputs:
        if wanted is not None:
            if tensor.name not in wanted:
                continue
            if wanted[tensor.name]:
                batched = served is not None and served.batched
                labels = None if served is None else served.labels
                tensor = classify(tensor, wanted[tensor.name], batched, labels)
        outputs.add(name=tensor.name, datatype=tensor.datatype.wire, shape=tensor.shape)
        if in_shm is not None and tensor.name in in_shm:
            # Written into the client's region; its raw entry stays empty, as in Triton.
            in_shm[tensor.name].write_output(tensor.name, _raw_output(tensor))
            raws.append(b"")
            continue
        raws.append(_raw_output(tensor))


def _class_counts(request: InferenceRequest) -> dict[str, int] | None:
    """Each requested output's classification count (0: the tensor itself); None: all."""
    if request.requested_outputs is None:
        return None
    counts = {}
    for output in request.requested_outputs:
        count = output.parameters.get("classification", 0)
        counts[output.name] = count if type(count) is int else 0
    return counts


def _raw_output(tensor: Tensor) -> bytes | memoryview:
    data = tensor.data
    if data.size != tensor.element_count:
        raise TritiumError(
            ErrorCode.INTERNAL,
            f"output '{tensor.name}' has {data.size} elements but its shape "
            f"{list(tensor.shape)} needs {tensor.element_count}",
        )
    return tensor_bytes(tensor)


def set_parameters(target: Any, params: dict[str, Any]) -> None:
    """Write response parameters into an InferParameter map."""
    for key, value in params.items():
        slot = target[key]
        if isinstance(value, bool):
            slot.bool_param = value
        elif isinstance(value, int):
            if value > _INT64_MAX:
                slot.uint64_param = value
            else:
                slot.int64_param = value
        elif isinstance(value, float):
            slot.double_param = value
        else:
            slot.string_param = value if isinstance(value, str) else str(value)


def encode_stream_response(
    response: InferenceResponse, request: InferenceRequest
) -> pb.ModelStreamInferResponse | None:
    """The stream message for one response; None when nothing is to be written."""
    state = request.frontend_state
    if response.error is not None:
        message = pb.ModelStreamInferResponse(error_message=response.error.message)
        _fill_bare(message.infer_response, request, state)
    elif response.flag_only:
        if not (isinstance(state, GrpcRequestState) and state.empty_final):
            return None
        message = pb.ModelStreamInferResponse()
        _fill_bare(message.infer_response, request, state)
    else:
        try:
            infer = infer_response_message(response, request)
        except TritiumError as exc:
            return encode_stream_response(InferenceResponse.failure(exc, response.final), request)
        message = pb.ModelStreamInferResponse(infer_response=infer)
    message.infer_response.parameters[FINAL_KEY].bool_param = response.final
    return message


def _fill_bare(target: pb.ModelInferResponse, request: InferenceRequest, state: Any) -> None:
    target.id = request.id
    target.model_name = request.model_name
    if isinstance(state, GrpcRequestState):
        target.model_version = state.version_text


def encode_stream_error(error: TritiumError, request_id: str) -> pb.ModelStreamInferResponse:
    """A request that was refused before it reached a model: its id and the message."""
    return pb.ModelStreamInferResponse(
        error_message=error.message, infer_response=pb.ModelInferResponse(id=request_id)
    )


# ------------------------------------------------------------- metadata, repository


def encode_server_metadata(meta: dict[str, Any]) -> pb.ServerMetadataResponse:
    return pb.ServerMetadataResponse(
        name=meta["name"], version=meta["version"], extensions=meta["extensions"]
    )


def encode_model_metadata(meta: ModelMetadata) -> pb.ModelMetadataResponse:
    def tensors(items: list[TensorMetadata]) -> list[pb.ModelMetadataResponse.TensorMetadata]:
        return [
            pb.ModelMetadataResponse.TensorMetadata(name=t.name, datatype=t.datatype, shape=t.shape)
            for t in items
        ]

    return pb.ModelMetadataResponse(
        name=meta.name,
        versions=meta.versions,
        platform=meta.platform,
        inputs=tensors(meta.inputs),
        outputs=tensors(meta.outputs),
    )


def encode_repository_index(entries: Iterable[IndexEntry]) -> pb.RepositoryIndexResponse:
    return pb.RepositoryIndexResponse(models=[
        pb.RepositoryIndexResponse.ModelIndex(
            name=entry.name,
            version="" if entry.version is None else str(entry.version),
            state=entry.state.value,
            reason=entry.reason,
        )
        for entry in entries
    ])


def decode_repository_parameters(params: Any) -> dict[str, bool | int | str | bytes]:
    """Load/unload parameters (``config`` text, ``file:<path>`` bytes, ...) as values."""
    values: dict[str, bool | int | str | bytes] = {}
    for key, value in params.items():
        kind = value.WhichOneof("parameter_choice")
        if kind is None:
            raise invalid(f"repository parameter '{key}' has no value")
        values[key] = getattr(value, kind)
    return values


# ------------------------------------------------------------------ log, trace settings

# The settings' value types are the core's; this is only where each sits in the oneof.
_LOG_PARAM: dict[type, str] = {bool: "bool_param", int: "uint32_param", str: "string_param"}


def decode_log_settings(message: pb.LogSettingsRequest) -> dict[str, LogValue | None]:
    """The settings a LogSettings call asks to change (a key without a value is None); the
    core checks names and values, this only that each value sits in its setting's field."""
    updates: dict[str, LogValue | None] = {}
    for key, value in message.settings.items():
        kind = value.WhichOneof("parameter_choice")
        expected = LOG_SETTING_TYPES.get(key)
        if kind is not None and expected is not None and kind != _LOG_PARAM[expected]:
            raise invalid(f"log setting '{key}' expects {_LOG_PARAM[expected]}, got {kind}")
        updates[key] = None if kind is None else getattr(value, kind)
    return updates


def encode_log_settings(settings: Mapping[str, LogValue]) -> pb.LogSettingsResponse:
    message = pb.LogSettingsResponse()
    for key, value in settings.items():
        setattr(message.settings[key], _LOG_PARAM[type(value)], value)
    return message


def decode_trace_settings(message: pb.TraceSettingRequest) -> dict[str, TraceValue | None]:
    """gRPC lists every value; the core holds one string per setting but the level list.
    An empty list resets the setting (None)."""
    updates: dict[str, TraceValue | None] = {}
    for key, value in message.settings.items():
        values = list(value.value)
        if not values:
            updates[key] = None
        elif key in LIST_TRACE_SETTINGS:
            updates[key] = values
        elif len(values) == 1:
            updates[key] = values[0]
        else:
            raise invalid(f"trace setting '{key}' takes one value, got {len(values)}")
    return updates


def encode_trace_settings(settings: Mapping[str, TraceValue]) -> pb.TraceSettingResponse:
    message = pb.TraceSettingResponse()
    for key, value in settings.items():
        message.settings[key].value.extend(value if isinstance(value, list) else [value])
    return message


# ------------------------------------------------------------------------ statistics


def _duration(value: Duration) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=value.count, ns=value.ns)


def _model_statistics(entry: ModelStatisticsEntry) -> pb.ModelStatistics:
    stats: ModelStatistics = entry.stats
    return pb.ModelStatistics(
        name=entry.name,
        version=str(entry.version),
        last_inference=stats.last_inference_ms,
        inference_count=stats.inference_count,
        execution_count=stats.execution_count,
        inference_stats=pb.InferStatistics(
            success=_duration(stats.success),
            fail=_duration(stats.fail),
            queue=_duration(stats.queue),
            compute_input=_duration(stats.compute_input),
            compute_infer=_duration(stats.compute_infer),
            compute_output=_duration(stats.compute_output),
            cache_hit=_duration(stats.cache_hit),
            cache_miss=_duration(stats.cache_miss),
        ),
        batch_stats=[
            pb.InferBatchStatistics(batch_size=size,
                                    compute_input=_duration(Duration(timing.count)),
                                    compute_infer=_duration(timing),
                                    compute_output=_duration(Duration(timing.count)))
            for size, timing in sorted(dict(stats.batches).items())
        ],
    )


def encode_model_statistics(entries: list[ModelStatisticsEntry]) -> pb.ModelStatisticsResponse:
    return pb.ModelStatisticsResponse(model_stats=[_model_statistics(e) for e in entries])
