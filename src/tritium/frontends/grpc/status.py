"""Core error codes to gRPC status codes (spec/grpc.md §2)."""

from __future__ import annotations

import grpc

from tritium.core.errors import ErrorCode

STATUS_BY_CODE: dict[ErrorCode, grpc.StatusCode] = {
    ErrorCode.UNKNOWN: grpc.StatusCode.UNKNOWN,
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
    ErrorCode.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.INVALID_ARG: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorCode.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorCode.CANCELLED: grpc.StatusCode.CANCELLED,
    ErrorCode.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def grpc_status(code: ErrorCode) -> grpc.StatusCode:
    """The status an RPC ends with when the core raised ``code``."""
    return STATUS_BY_CODE.get(code, grpc.StatusCode.UNKNOWN)
