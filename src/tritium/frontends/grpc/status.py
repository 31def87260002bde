"""Core error codes to gRPC status codes (spec/grpc.md §2)."""

from __future__ import annotations

from tritium.core.errors import ErrorCode
from tritium.frontends.grpc.http2 import GrpcStatus

STATUS_BY_CODE: dict[ErrorCode, GrpcStatus] = {
    ErrorCode.UNKNOWN: GrpcStatus.UNKNOWN,
    ErrorCode.INTERNAL: GrpcStatus.INTERNAL,
    ErrorCode.NOT_FOUND: GrpcStatus.NOT_FOUND,
    ErrorCode.INVALID_ARG: GrpcStatus.INVALID_ARGUMENT,
    ErrorCode.UNAVAILABLE: GrpcStatus.UNAVAILABLE,
    ErrorCode.UNSUPPORTED: GrpcStatus.UNIMPLEMENTED,
    ErrorCode.ALREADY_EXISTS: GrpcStatus.ALREADY_EXISTS,
    ErrorCode.CANCELLED: GrpcStatus.CANCELLED,
    ErrorCode.DEADLINE_EXCEEDED: GrpcStatus.DEADLINE_EXCEEDED,
}


def grpc_status(code: ErrorCode) -> GrpcStatus:
    """The status an RPC ends with when the core raised ``code``."""
    return STATUS_BY_CODE.get(code, GrpcStatus.UNKNOWN)
