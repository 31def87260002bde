"""Request parameters the server itself reads: sequence fields, priority, timeout, triton_* keys."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tritium.core import messages
from tritium.core.errors import TritiumError, invalid
from tritium.core.request import SEQUENCE_END, SEQUENCE_START, InferenceRequest

RESERVED_PREFIX = "triton_"


@dataclass(frozen=True, slots=True)
class ValueNames:
    """How a wire format words a parameter of the wrong type: templates (core/messages.py)
    taking the parameter's ``key`` and what the format ``expected`` for that key."""

    unsigned: str = messages.JSON_NOT_UNSIGNED
    boolean: str = messages.JSON_NOT_BOOL
    string: str = messages.JSON_NOT_STRING
    # A negative number where an unsigned one belongs, when the format words it apart.
    negative: str | None = None
    expected: Mapping[str, str] = field(default_factory=dict)

    def refusal(self, template: str, key: str) -> TritiumError:
        return invalid(template.format(key=key, expected=self.expected.get(key, "")))


PLAIN_NAMES = ValueNames()


def parse_unsigned(key: str, value: Any, names: ValueNames = PLAIN_NAMES) -> int:
    """``value`` if it is an int in [0, 2**64) (a bool is not); INVALID_ARG otherwise."""
    if type(value) is not int or not 0 <= value < 1 << 64:
        negative = type(value) is int and value < 0
        template = names.negative if negative and names.negative else names.unsigned
        raise names.refusal(template, key)
    return value


def parse_bool(key: str, value: Any, names: ValueNames = PLAIN_NAMES) -> bool:
    """``value`` if it is a bool; INVALID_ARG otherwise."""
    if type(value) is not bool:
        raise names.refusal(names.boolean, key)
    return value


def apply_known_parameter(
    request: InferenceRequest, key: str, value: Any, names: ValueNames = PLAIN_NAMES
) -> bool:
    """Set the request field ``key`` stands for from its decoded value; False if none does."""
    setter = _SETTERS.get(key)
    if setter is None:
        return False
    setter(request, value, names)
    return True


def refuse_reserved(key: str, also: frozenset[str] = frozenset(),
                    prefix_text: str = messages.RESERVED_PREFIX_HTTP) -> None:
    """Refuse a model parameter whose key Triton keeps for itself (``also``: more such keys);
    ``prefix_text``: how the frontend words a key starting with ``triton_``."""
    if key.startswith(RESERVED_PREFIX):
        raise invalid(prefix_text)
    if key in also:
        raise invalid(
            f"parameter key '{key}' is reserved for Triton usage and should not be specified."
        )


def _sequence_id(request: InferenceRequest, value: Any, names: ValueNames) -> None:
    # Triton reads an unsigned integer, else a string: what it says is the string's refusal.
    if not (type(value) is str or (type(value) is int and 0 <= value < 1 << 64)):
        raise names.refusal(names.string, "sequence_id")
    request.correlation_id = value


def _sequence_start(request: InferenceRequest, value: Any, names: ValueNames) -> None:
    if parse_bool("sequence_start", value, names):
        request.flags |= SEQUENCE_START


def _sequence_end(request: InferenceRequest, value: Any, names: ValueNames) -> None:
    if parse_bool("sequence_end", value, names):
        request.flags |= SEQUENCE_END


def _priority(request: InferenceRequest, value: Any, names: ValueNames) -> None:
    request.priority = parse_unsigned("priority", value, names)


def _timeout(request: InferenceRequest, value: Any, names: ValueNames) -> None:
    request.timeout_us = parse_unsigned("timeout", value, names)


_SETTERS: dict[str, Callable[[InferenceRequest, Any, ValueNames], None]] = {
    "sequence_id": _sequence_id,
    "sequence_start": _sequence_start,
    "sequence_end": _sequence_end,
    "priority": _priority,
    "timeout": _timeout,
}
