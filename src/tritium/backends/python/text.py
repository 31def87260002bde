"""Text arguments as Triton's pybind11 signatures take them: str, or bytes holding UTF-8."""

from __future__ import annotations

from typing import Any


def as_text(value: Any) -> Any:
    """``value`` decoded when it is bytes; anything else is returned as it is.

    Triton declares names, ids and messages as ``std::string``, and pybind11 fills one
    from a Python ``bytes`` (or ``bytearray``) as readily as from a ``str``. Bytes that
    are not UTF-8 could never name anything here, so they are decoded with replacement
    characters rather than refused.
    """
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return value

