"""Argument checks as Triton's pybind11 bindings make them.

pybind11 converts each argument to the C++ type of Triton's signature before any of
Triton's code runs, and raises TypeError ("incompatible function arguments") when one does
not convert: a ``std::string`` takes str or bytes, an integer type takes an int (or an
object with ``__index__``, bools included) that fits it but never a float, a
``std::vector`` takes any sequence but a str, and ``.none(false)`` refuses None. What
Triton's own code checks after that raises TritonModelException instead.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, TypeGuard, TypeVar

from tritium.backends.python.text import as_text

T = TypeVar("T")

INT64 = (-(1 << 63), (1 << 63) - 1)
UINT32 = (0, (1 << 32) - 1)
UINT64 = (0, (1 << 64) - 1)


def incompatible(call: str, name: str, expected: str, value: object) -> TypeError:
    return TypeError(f"{call}: incompatible function arguments: '{name}' must be {expected}, "
                     f"got {type(value).__name__} {value!r:.80}")


def text(call: str, name: str, value: object) -> str:
    """A ``std::string`` argument: str, or bytes holding UTF-8."""
    if type(value) is str:
        return value
    if not isinstance(value, str | bytes | bytearray):
        raise incompatible(call, name, "str", value)
    return str(as_text(value))


def text_list(call: str, name: str, values: object) -> list[str]:
    """A ``std::vector<std::string>`` argument."""
    if not _is_sequence(values):
        raise incompatible(call, name, "a list of str", values)
    return [text(call, name, value) for value in values]


def integer(call: str, name: str, value: object, bounds: tuple[int, int]) -> int:
    """An integer argument of the C++ type whose range ``bounds`` gives."""
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise incompatible(call, name, "int", value) from None
    if not bounds[0] <= number <= bounds[1]:
        raise incompatible(call, name, f"an int in [{bounds[0]}, {bounds[1]}]", value)
    return number


def instances(call: str, name: str, values: object, kind: type[T]) -> list[T | None]:
    """A ``std::vector<std::shared_ptr<kind>>`` argument; a None element converts (to an
    empty pointer) and is the caller's to refuse, as Triton's own code does."""
    if not _is_sequence(values):
        raise incompatible(call, name, f"a list of {kind.__name__}", values)
    # Exact types are tested in C first (this runs for every response); a subclass
    # of ``kind`` or a None takes the loop.
    if not {kind}.issuperset(map(type, values)):
        for value in values:
            if value is not None and not isinstance(value, kind):
                raise incompatible(call, name, f"a list of {kind.__name__}", value)
    return list(values)


def _is_sequence(values: object) -> TypeGuard[Sequence[Any]]:
    """What pybind11 converts to a ``std::vector``: a sequence, but no str or bytes."""
    # list and tuple first: the isinstance against the Sequence ABC runs Python code.
    if type(values) is list or type(values) is tuple:
        return True
    return not isinstance(values, str | bytes | bytearray) and isinstance(values, Sequence)


def optional_instance(call: str, name: str, value: Any, kind: type[T]) -> T | None:
    """A ``std::shared_ptr<kind>`` argument: None is allowed."""
    if value is not None and not isinstance(value, kind):
        raise incompatible(call, name, f"{kind.__name__} or None", value)
    return value
