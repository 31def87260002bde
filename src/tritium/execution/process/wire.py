"""Core requests, responses and errors as a call's payload (small plain values, in the
channel's codec) plus its buffers (each tensor's bytes), so that tensor data never goes
through the codec.

Fixed-size tensors travel as their raw little-endian bytes and come back as numpy views of
the received buffer; BYTES tensors in Triton's length-prefixed layout; BF16 as its 16-bit
patterns, as the core keeps it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.request import InferenceRequest, RequestedOutput
from tritium.core.response import InferenceResponse
from tritium.core.serialization import bytes_from_binary, tensor_bytes
from tritium.core.types import DataType, Tensor
from tritium.execution.process.codec import convert
from tritium.execution.process.messages import ErrorBody

# (name, wire datatype, shape) per tensor, in buffer order.
TensorHeader = tuple[str, str, tuple[int, ...]]


def encode_tensors(tensors: Sequence[Tensor]) -> tuple[list[TensorHeader], list[memoryview]]:
    headers: list[TensorHeader] = []
    buffers: list[memoryview] = []
    for tensor in tensors:
        headers.append((tensor.name, tensor.datatype.wire, tuple(tensor.shape)))
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
    name, wire, shape = header
    datatype = DataType.from_wire(wire)
    if datatype is None:
        raise TritiumError(ErrorCode.INTERNAL, f"tensor '{name}' has unknown datatype {wire}")
    count = int(np.prod(shape, dtype=np.int64))
    if datatype is DataType.BYTES:
        flat = bytes_from_binary(buffer, count, f"for tensor '{name}'")
    else:
        flat = np.frombuffer(buffer, dtype=datatype.numpy, count=count)
    return Tensor(name, datatype, tuple(shape), flat.reshape(shape))


# -- errors ------------------------------------------------------------------------------


def encode_error(error: TritiumError | None) -> ErrorBody | None:
    return None if error is None else ErrorBody.of(error)


def decode_error(payload: Any) -> TritiumError | None:
    """The error a payload field holds (an ``ErrorBody`` as it crossed), or None."""
    if payload is None:
        return None
    body: ErrorBody = convert(ErrorBody, payload)
    return body.error()


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


def encode_request(request: InferenceRequest) -> tuple[dict[str, Any], list[memoryview]]:
    headers, buffers = encode_tensors(list(request.inputs.values()))
    names = request.requested_output_names()
    trace = request.trace
    payload = {
        "model_name": request.model_name,
        "model_version": request.model_version,
        "id": request.id,
        "inputs": headers,
        "outputs": names,
        "parameters": dict(request.parameters),
        "correlation_id": request.correlation_id,
        "flags": request.flags,
        "timeout_us": request.timeout_us,
        "trace_slot": trace.slot if isinstance(trace, TraceRef) else None,
    }
    return payload, buffers


def decode_request(payload: dict[str, Any], buffers: Sequence[memoryview]) -> InferenceRequest:
    inputs = decode_tensors(payload["inputs"], buffers)
    names = payload["outputs"]
    return InferenceRequest(
        model_name=payload["model_name"],
        inputs={tensor.name: tensor for tensor in inputs},
        model_version=payload["model_version"],
        id=payload["id"],
        requested_outputs=None if names is None else [RequestedOutput(n) for n in names],
        parameters=payload["parameters"],
        correlation_id=payload["correlation_id"],
        flags=payload["flags"],
        timeout_us=payload["timeout_us"],
    )


# -- responses ---------------------------------------------------------------------------


def encode_response(response: InferenceResponse) -> tuple[dict[str, Any], list[memoryview]]:
    headers, buffers = encode_tensors(response.outputs)
    payload = {
        "outputs": headers,
        "parameters": dict(response.parameters),
        "error": encode_error(response.error),
        "final": response.final,
        "flag_only": response.flag_only,
    }
    return payload, buffers


def decode_response(payload: dict[str, Any], buffers: Sequence[memoryview]
                    ) -> InferenceResponse:
    return InferenceResponse(
        outputs=decode_tensors(payload["outputs"], buffers),
        parameters=payload["parameters"],
        error=decode_error(payload["error"]),
        final=payload["final"],
        flag_only=payload["flag_only"],
    )
