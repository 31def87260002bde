"""OpenAI's error object and status codes, which the ``openai`` SDK turns into its exceptions."""

from __future__ import annotations

from typing import Any

import orjson

from tritium.core.errors import ErrorCode, TritiumError

# The scheduler's text for a full queue (Triton's): the one UNAVAILABLE that means "try
# again soon" (429) rather than "this server cannot serve now" (503).
_QUEUE_FULL = "Exceeds maximum queue size"

# status and OpenAI error type for each core error code; unlisted codes are 500s.
_BY_CODE: dict[ErrorCode, tuple[int, str]] = {
    ErrorCode.INVALID_ARG: (400, "invalid_request_error"),
    ErrorCode.UNSUPPORTED: (400, "invalid_request_error"),
    ErrorCode.CANCELLED: (400, "invalid_request_error"),
    ErrorCode.ALREADY_EXISTS: (400, "invalid_request_error"),
    ErrorCode.NOT_FOUND: (404, "invalid_request_error"),
    ErrorCode.UNAVAILABLE: (503, "service_unavailable_error"),
    ErrorCode.DEADLINE_EXCEEDED: (503, "timeout_error"),
}


class OpenAIError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code

    def body(self) -> bytes:
        return orjson.dumps({"error": self.object()})

    def object(self) -> dict[str, Any]:
        return {"message": self.message, "type": self.type, "param": self.param,
                "code": self.code}


def bad_param(param: str, message: str) -> OpenAIError:
    return OpenAIError(400, message, param=param, code="invalid_value")


def model_not_found(name: str) -> OpenAIError:
    return OpenAIError(404, f"The model '{name}' does not exist", param="model",
                       code="model_not_found")


def from_tritium(error: TritiumError) -> OpenAIError:
    """The OpenAI form of an error the core or a model raised."""
    if error.code is ErrorCode.UNAVAILABLE and error.message.startswith(_QUEUE_FULL):
        return OpenAIError(429, error.message, "rate_limit_error", code="rate_limit_exceeded")
    status, type_ = _BY_CODE.get(error.code, (500, "server_error"))
    return OpenAIError(status, error.message, type_, code=error.code.name.lower())
