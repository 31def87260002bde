"""Core error codes to HTTP status codes (spec/http.md §1)."""

from __future__ import annotations

from tritium.core.errors import ErrorCode

STATUS_BY_CODE = {
    ErrorCode.INTERNAL: 500,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.UNSUPPORTED: 501,
    ErrorCode.DEADLINE_EXCEEDED: 503,
}


def http_status(code: ErrorCode) -> int:
    """Everything not listed (INVALID_ARG, CANCELLED, ...) is a 400, as in Triton."""
    return STATUS_BY_CODE.get(code, 400)
