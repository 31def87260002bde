"""gRPC status codes, and the table from core error codes to them (spec/grpc.md §2)."""

from __future__ import annotations

import enum

from tritium.core.errors import ErrorCode


class GrpcStatus(enum.IntEnum):
    """The ``grpc-status`` codes."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


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
