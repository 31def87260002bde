"""tritonserver's value syntaxes: booleans, pairs, and ``<name>,<key>=<value>`` settings.

Each parser takes the text after the flag and returns plain values, or raises
``argparse.ArgumentTypeError`` with a one-line reason (argparse turns it into exit code 2).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

T1 = TypeVar("T1")
T2 = TypeVar("T2")
Setting = tuple[str, str, str]  # (name, or "" for a global setting; key; value)

_TRUE = ("true", "on", "1")
_FALSE = ("false", "off", "0")


def triton_bool(text: str) -> bool:
    """true/on/1 and false/off/0, in any case, as tritonserver reads a boolean."""
    lowered = text.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"invalid value for bool option: {text}")


def verbose_level(text: str) -> int:
    """--log-verbose: a level, or true (1) / false (0)."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return int(lowered == "true")
    level = integer(text)
    if level < 0:
        raise argparse.ArgumentTypeError(f"expected a level >= 0, got {text}")
    return level


def integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"Invalid option value. Got {text}") from None


def number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"Invalid option value. Got {text}") from None


def positive_number(text: str) -> float:
    value = number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def pair(first: Callable[[str], T1], second: Callable[[str], T2], delimiter: str
         ) -> Callable[[str], tuple[T1, T2]]:
    """``<first><delimiter><second>``, e.g. 0:1073741824 or 8000-8100."""

    def parse(text: str) -> tuple[T1, T2]:
        head, found, tail = text.partition(delimiter)
        if not found:
            raise argparse.ArgumentTypeError(
                f"expected <first>{delimiter}<second>, got '{text}'")
        return first(head), second(tail)

    return parse


def named_setting(option: str, name_word: str, optional_name: bool
                  ) -> Callable[[str], Setting]:
    """``<name>,<key>=<value>``; with ``optional_name`` also the global ``<key>=<value>``.

    The key ends at the first '=' after the name, so values may hold commas and '='.
    """

    def parse(text: str) -> Setting:
        comma = text.find(",")
        equals = text.find("=")
        if comma < 0 or (equals >= 0 and equals < comma):
            if not optional_name:
                raise _setting_error(option, name_word, text, "no " + name_word)
            name, rest = "", text
        else:
            name, rest = text[:comma], text[comma + 1:]
            if not name:
                raise _setting_error(option, name_word, text, "no " + name_word)
        key, found, value = rest.partition("=")
        if not found or not key or not value:
            raise _setting_error(option, name_word, text, "")
        return name, key, value

    return parse


def _setting_error(option: str, name_word: str, text: str, what: str
                   ) -> argparse.ArgumentTypeError:
    lead = f"{what}: " if what else ""
    return argparse.ArgumentTypeError(
        f"{lead}--{option} takes <{name_word}>,<setting>=<value>, got '{text}'")


def key_value(option: str) -> Callable[[str], tuple[str, str]]:
    """``<key>=<value>`` (--metrics-config)."""

    def parse(text: str) -> tuple[str, str]:
        key, found, value = text.partition("=")
        if not found or not key or not value or "," in key:
            raise argparse.ArgumentTypeError(
                f"--{option} option format is <setting>=<value>. Got {text}")
        return key, value

    return parse


def rate_limit_resource(text: str) -> tuple[str, int, int]:
    """``<name>:<count>`` or ``<name>:<count>:<device>`` (device -1: every device)."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0]:
        raise argparse.ArgumentTypeError(
            "--rate-limit-resource takes <resource_name>:<count>:<device> or "
            f"<resource_name>:<count>, got '{text}'")
    device = integer(parts[2]) if len(parts) == 3 else -1
    count = integer(parts[1])
    if count < 0:
        raise argparse.ArgumentTypeError(
            f"--rate-limit-resource count must not be negative, got '{text}'")
    # The name keeps its case: tritonserver lower-cases a copy it never reads.
    return parts[0], count, device


def choice(*allowed: str, fold_case: bool = True) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.lower() if fold_case else text
        if value not in allowed:
            raise argparse.ArgumentTypeError(
                f"expected one of {', '.join(allowed)}, got '{text}'")
        return value

    return parse


def trace_level(text: str) -> str:
    """OFF, TIMESTAMPS or TENSORS, from tritonserver's spellings of them."""
    lowered = text.lower()
    if lowered in ("false", "off"):
        return "OFF"
    if lowered in ("true", "on", "min", "max", "timestamps"):
        return "TIMESTAMPS"
    if lowered == "tensors":
        return "TENSORS"
    raise argparse.ArgumentTypeError(f"invalid value for trace level option: {text}")


def trace_mode(text: str) -> str:
    lowered = text.lower()
    if lowered not in ("triton", "opentelemetry"):
        raise argparse.ArgumentTypeError(
            f'invalid value for trace mode option: {text}. Available options are "triton" '
            'and "opentelemetry"')
    return lowered


def trace_setting(text: str) -> Setting:
    """``[mode,]key=value``; the mode is checked (triton or opentelemetry)."""
    name, key, value = named_setting("trace-config", "trace mode", True)(text)
    return (trace_mode(name) if name else ""), key, value
