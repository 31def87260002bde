"""pb_utils.TritonError, TritonModelException and their mapping to core error codes."""

from __future__ import annotations

import enum

from tritium.backends.python.text import as_text
from tritium.core.errors import ErrorCode, TritiumError


class TritonErrorCode(enum.IntEnum):
    """TRITONSERVER_Error_Code, numbered as Triton numbers it."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7


class TritonModelException(Exception):
    """The exception pb_utils raises into model code (and models may raise themselves)."""


class TritonError:
    """An error a model attaches to a response. Not an exception, as in Triton."""

    __slots__ = ("_code", "_message")

    UNKNOWN = TritonErrorCode.UNKNOWN
    INTERNAL = TritonErrorCode.INTERNAL
    NOT_FOUND = TritonErrorCode.NOT_FOUND
    INVALID_ARG = TritonErrorCode.INVALID_ARG
    UNAVAILABLE = TritonErrorCode.UNAVAILABLE
    UNSUPPORTED = TritonErrorCode.UNSUPPORTED
    ALREADY_EXISTS = TritonErrorCode.ALREADY_EXISTS
    CANCELLED = TritonErrorCode.CANCELLED

    def __init__(self, message: str | bytes, code: int = TritonErrorCode.INTERNAL) -> None:
        if message is None or code is None:
            raise TypeError("TritonError needs a message and a code (neither may be None)")
        self._message = str(as_text(message))  # std::string in Triton: bytes too
        self._code = TritonErrorCode(code)

    def message(self) -> str:
        return self._message

    def code(self) -> TritonErrorCode:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, {self._code.name})"

    def to_core(self) -> TritiumError:
        return TritiumError(_TO_CORE[self._code], self._message)

    @classmethod
    def from_core(cls, error: TritiumError) -> TritonError:
        return cls(error.message, _FROM_CORE.get(error.code, TritonErrorCode.UNKNOWN))


_TO_CORE = {code: ErrorCode[code.name] for code in TritonErrorCode}
# Triton has no deadline code: its queue timeout is reported as UNAVAILABLE.
_FROM_CORE = {
    code: TritonErrorCode[code.name]
    for code in ErrorCode
    if code.name in TritonErrorCode.__members__
}
_FROM_CORE[ErrorCode.DEADLINE_EXCEEDED] = TritonErrorCode.UNAVAILABLE


def describe_exception(exc: BaseException) -> str:
    """How Triton's stub names a Python exception in an error message."""
    text = str(exc)
    name = type(exc).__name__
    return f"{name}: {text}" if text else name
