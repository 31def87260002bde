"""Trace settings as ``--trace-config [mode,]key=value`` gives them (Triton's keys)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

MODES = ("triton", "opentelemetry")
LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
UINT32_MAX = 2**32 - 1
INT32_MAX = 2**31 - 1
DEFAULT_SERVICE_NAME = "triton-inference-server"

# Triton's global keys, and each mode's own.
_GLOBAL = ("rate", "level", "count", "mode")
_MODE_KEYS = {
    "triton": ("file", "log-frequency"),
    "opentelemetry": ("url", "resource", "bsp_max_queue_size", "bsp_schedule_delay",
                      "bsp_max_export_batch_size"),
}


@dataclass(frozen=True, slots=True)
class TraceSettings:
    """The server's trace settings at startup; clients change level, rate, count and
    log frequency at run time (``control.TraceControl``), never the mode or the sinks."""

    level: tuple[str, ...] = ("OFF",)  # OFF alone, or TIMESTAMPS and/or TENSORS
    rate: int = 1000  # every rate-th request is traced; 0: only those that carry a context
    count: int = -1  # traces still to collect; -1: no limit
    mode: str = "triton"
    file: str = ""  # triton mode: where the JSON trace goes
    log_frequency: int = 0  # triton mode: write every N traces to file.<index>; 0: to file
    url: str | None = None  # opentelemetry: OTLP/HTTP endpoint (None: the SDK's, or OTEL_*)
    resource: tuple[tuple[str, str], ...] = ()  # opentelemetry resource attributes
    # Batch span processor; None leaves it to OTEL_BSP_* or the SDK's default.
    bsp_max_queue_size: int | None = None
    bsp_schedule_delay: int | None = None  # milliseconds
    bsp_max_export_batch_size: int | None = None
    given: frozenset[str] = field(default=frozenset())  # mode keys set on the command line

    @property
    def tracing(self) -> bool:
        return self.level != ("OFF",)

    @classmethod
    def from_flags(cls, pairs: Iterable[str]) -> TraceSettings:
        """Settings from ``--trace-config`` values in order (a later one wins; ``level``
        accumulates, as Triton's does). Raises ValueError with Triton's kind of message."""
        settings = cls()
        levels: list[str] = []
        for text in pairs:
            mode, key, value = _split(text)
            if key == "level":
                levels = _add_level(levels, value)
                settings = replace(settings, level=tuple(levels))
            else:
                settings = _set(settings, mode, key, value)
        return settings

    def mode_config(self) -> dict[str, str]:
        """The mode's own settings a client reads back, as strings (Triton lists the ones
        given at startup)."""
        if self.mode == "triton":
            return {}
        shown: dict[str, str] = {}
        if self.url is not None:
            shown["url"] = self.url
        for name, value in self.resource:
            shown["resource"] = f"{name}={value}"
        for key in ("bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size"):
            number = getattr(self, key)
            if number is not None:
                shown[key] = str(number)
        return shown


def _split(text: str) -> tuple[str | None, str, str]:
    head, sep, value = text.partition("=")
    if not sep:
        raise ValueError(f"--trace-config '{text}': expected [mode,]setting=value")
    mode, comma, key = head.partition(",")
    if not comma:
        mode, key = "", head
    mode, key = mode.strip(), key.strip()
    if mode and mode not in MODES:
        raise ValueError(f"--trace-config '{text}': unknown trace mode '{mode}'; the modes "
                         f"are {', '.join(MODES)}")
    allowed = _MODE_KEYS[mode] if mode else _GLOBAL
    if key not in allowed:
        where = f"mode '{mode}'" if mode else "global trace settings"
        raise ValueError(f"--trace-config '{text}': unknown setting '{key}' for {where}; "
                         f"the settings are {', '.join(allowed)}")
    return mode or None, key, value


def _add_level(levels: list[str], value: str) -> list[str]:
    level = value.strip().upper()
    if level not in LEVELS:
        raise ValueError(f"unknown trace level '{value}'; the levels are {', '.join(LEVELS)}")
    if level == "OFF":
        return ["OFF"]
    kept = [name for name in levels if name != "OFF"]
    return kept if level in kept else [*kept, level]


def _set(settings: TraceSettings, mode: str | None, key: str, value: str) -> TraceSettings:
    if key == "mode":
        if value not in MODES:
            raise ValueError(f"unknown trace mode '{value}'; the modes are {', '.join(MODES)}")
        return replace(settings, mode=value)
    given = settings.given | {key}
    if key == "rate":
        return replace(settings, rate=number(key, value, 0, UINT32_MAX))
    if key == "count":
        return replace(settings, count=number(key, value, -1, INT32_MAX))
    if key == "file":
        return replace(settings, file=value, given=given)
    if key == "log-frequency":
        return replace(settings, log_frequency=number(key, value, 0, UINT32_MAX), given=given)
    if key == "url":
        return replace(settings, url=value, given=given)
    if key == "resource":
        name, sep, attribute = value.partition("=")
        if not sep or not name:
            raise ValueError(f"trace resource '{value}': expected key=value")
        kept = tuple(pair for pair in settings.resource if pair[0] != name)
        return replace(settings, resource=(*kept, (name, attribute)), given=given)
    bsp: dict[str, Any] = {key: number(key, value, 1, UINT32_MAX)}
    return replace(settings, given=given, **bsp)


def number(key: str, value: str, lowest: int, highest: int) -> int:
    """``value`` as an integer in [lowest, highest], or ValueError naming ``key``."""
    try:
        parsed = int(value.strip())
    except ValueError:
        raise ValueError(f"Unable to parse '{key}', got: {value}") from None
    if not lowest <= parsed <= highest:
        raise ValueError(f"Unable to parse '{key}', value is out of range [ {lowest}, "
                         f"{highest} ], got: {value}")
    return parsed
