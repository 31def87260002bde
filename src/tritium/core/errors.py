"""Protocol-neutral error codes; each frontend maps them to its own status numbers."""

from __future__ import annotations

import enum


class ErrorCode(enum.Enum):
    UNKNOWN = "UNKNOWN"
    INTERNAL = "INTERNAL"
    NOT_FOUND = "NOT_FOUND"
    INVALID_ARG = "INVALID_ARG"
    UNAVAILABLE = "UNAVAILABLE"
    UNSUPPORTED = "UNSUPPORTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"


class TritiumError(Exception):
    """An error with a code that frontends translate to HTTP or gRPC status."""

    def __init__(self, code: ErrorCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"TritiumError({self.code.name}, {self.message!r})"


def invalid(message: str) -> TritiumError:
    return TritiumError(ErrorCode.INVALID_ARG, message)
