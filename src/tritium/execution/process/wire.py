"""Core requests and responses as a call's payload (``BlsRequest``, ``BlsResponse``: named
messages the codec checks on arrival) plus its buffers (each tensor's bytes), so that
tensor data never goes through the codec.

Fixed-size tensors travel as their raw little-endian bytes and come back as numpy views of
the received buffer; BYTES tensors in Triton's length-prefixed layout; BF16 as its 16-bit
patterns, as the core keeps it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.request import InferenceRequest, RequestedOutput
from tritium.core.response import InferenceResponse
from tritium.core.serialization import bytes_from_binary, tensor_bytes
from tritium.core.types import DataType, Tensor
from tritium.execution.process.codec import convert
from tritium.execution.process.messages import BlsRequest, BlsResponse, ErrorBody, TensorHeader


def encode_tensors(tensors: Iterable[Tensor]) -> tuple[list[TensorHeader], list[memoryview]]:
    headers: list[TensorHeader] = []
    buffers: list[memoryview] = []
    for tensor in tensors:
        headers.append(TensorHeader(tensor.name, tensor.datatype.wire, tuple(tensor.shape)))
        buffers.append(memoryview(tensor_bytes(tensor)).cast("B"))
    return headers, buffers


def decode_tensors(headers: Sequence[TensorHeader], buffers: Sequence[memoryview]
                   ) -> list[Tensor]:
    if len(headers) != len(buffers):
        raise TritiumError(ErrorCode.INTERNAL,
                           f"{len(headers)} tensors arrived with {len(buffers)} buffers")
    return [_decode_tensor(header, buffer)
            for header, buffer in zip(headers, buffers, strict=True)]


def _decode_tensor(header: TensorHeader, buffer: memoryview) -> Tensor:
    name, shape = header.name, header.shape
    datatype = DataType.from_wire(header.datatype)
    if datatype is None:
        raise TritiumError(ErrorCode.INTERNAL,
                           f"tensor '{name}' has unknown datatype {header.datatype}")
    count = _count(name, shape)
    if datatype is DataType.BYTES:
        flat = bytes_from_binary(buffer, count, f"for tensor '{name}'")
    elif count * datatype.itemsize != len(buffer):
        raise TritiumError(ErrorCode.INTERNAL, f"tensor '{name}' of shape {list(shape)} "
                           f"arrived with {len(buffer)} bytes")
    else:
        flat = np.frombuffer(buffer, dtype=datatype.numpy, count=count)
    return Tensor(name, datatype, tuple(shape), flat.reshape(shape))


def _count(name: str, shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        if dim < 0:
            raise TritiumError(ErrorCode.INTERNAL, f"tensor '{name}' has a negative dimension")
        count *= dim
    return count


# -- requests ----------------------------------------------------------------------------


class TraceRef:
    """In the instance process, the trace of a request it executes: the W3C context the
    server sent (``get_context()``) and the request's slot, which a BLS request made with
    ``trace=request.trace()`` names so the server nests it. Its timestamps are the
    server's: the server records the compute span around the batch."""

    __slots__ = ("_context", "slot")

    def __init__(self, context: str, slot: int) -> None:
        self._context = context
        self.slot = slot

    def event(self, name: str, ns: int) -> None:
        pass

    def tensors(self, activity: str, tensors: Any) -> None:
        pass

    def context(self) -> str | None:
        return self._context or None


def encode_request(request: InferenceRequest) -> tuple[BlsRequest, list[memoryview]]:
    headers, buffers = encode_tensors(request.inputs.values())
    trace = request.trace
    # Positional, in BlsRequest's field order (keywords cost more); the dicts are packed
    # before the call returns, so they are not copied.
    payload = BlsRequest(request.model_name, request.model_version, request.id, headers,
                         request.requested_output_names(), request.parameters,
                         request.correlation_id, request.flags, request.timeout_us,
                         trace.slot if isinstance(trace, TraceRef) else None)
    return payload, buffers


def decode_request(sent: BlsRequest, buffers: Sequence[memoryview]) -> InferenceRequest:
    """The request as the server runs it (``sent``: a call's payload, ``convert``ed)."""
    inputs = decode_tensors(sent.inputs, buffers)
    names = sent.outputs
    return InferenceRequest(
        model_name=sent.model_name,
        inputs={tensor.name: tensor for tensor in inputs},
        model_version=sent.model_version,
        id=sent.id,
        requested_outputs=None if names is None else [RequestedOutput(n) for n in names],
        parameters=sent.parameters,
        correlation_id=sent.correlation_id,
        flags=sent.flags,
        timeout_us=sent.timeout_us,
    )


# -- responses ---------------------------------------------------------------------------


def encode_response(response: InferenceResponse) -> tuple[BlsResponse, list[memoryview]]:
    headers, buffers = encode_tensors(response.outputs)
    error = None if response.error is None else ErrorBody.of(response.error)
    payload = BlsResponse(headers, response.parameters, error, response.final,
                          response.flag_only)
    return payload, buffers


def decode_response(payload: Any, buffers: Sequence[memoryview]) -> InferenceResponse:
    """The response a reply's payload (as decoded) names; ``FrameError`` if none."""
    sent: BlsResponse = convert(BlsResponse, payload)
    return InferenceResponse(
        outputs=decode_tensors(sent.outputs, buffers),
        parameters=sent.parameters,
        error=None if sent.error is None else sent.error.error(),
        final=sent.final,
        flag_only=sent.flag_only,
    )
