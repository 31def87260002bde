"""Trace settings clients read and change at run time (Triton's trace extension), global
and per model, and the sampling that follows them.

As in Triton, a model's settings are the global ones except those set for that model; a
setting updated to null falls back (a model's to the global value, the global one to the
startup value). Each update starts a fresh sampler, so rate and count count from there.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tritium.core.errors import ErrorCode, TritiumError, invalid
from tritium.core.logging_settings import TraceValue
from tritium.tracing.settings import INT32_MAX, LEVELS, UINT32_MAX, TraceSettings, number

# The settings a client may send, and the startup field each one stands for.
_FIELDS = {"trace_level": "level", "trace_rate": "rate", "trace_count": "count",
           "log_frequency": "log_frequency"}
_RANGES = {"rate": (0, UINT32_MAX), "count": (-1, INT32_MAX), "log_frequency": (0, UINT32_MAX)}
_KNOWN = (*_FIELDS, "trace_file", "trace_mode")


@dataclass(frozen=True, slots=True)
class Effective:
    """One model's (or the global) settings in force."""

    level: tuple[str, ...]
    rate: int
    count: int
    log_frequency: int

    @property
    def tracing(self) -> bool:
        return self.level != ("OFF",)


class Sampler:
    """Which requests one set of settings traces: every rate-th, while count lasts."""

    def __init__(self, settings: Effective):
        self.settings = settings
        self.remaining = settings.count
        self._seen = 0
        self._lock = threading.Lock()

    def sample(self, forced: bool) -> bool:
        """Whether to trace the next request (``forced``: it carries a trace context)."""
        settings = self.settings
        if not settings.tracing:
            return False
        if settings.rate == 0:  # only requests that carry a context are traced
            return forced
        with self._lock:
            self._seen += 1
            hit = self._seen % settings.rate == 0 and self.remaining != 0
            if hit and self.remaining > 0:
                self.remaining -= 1
        return hit or forced


class TraceControl:
    """The global settings, each model's own, and their samplers."""

    def __init__(self, startup: TraceSettings):
        self.startup = startup
        self._default = Effective(startup.level, startup.rate, startup.count,
                                  startup.log_frequency)
        self._global: dict[str, Any] = {}  # fields a client set globally
        self._models: dict[str, dict[str, Any]] = {}  # fields a client set per model
        self._samplers: dict[str | None, Sampler] = {None: Sampler(self._default)}
        self.any_tracing = self._default.tracing

    def sampler(self, model_name: str) -> Sampler:
        return self._samplers.get(model_name) or self._samplers[None]

    def current(self, model_name: str | None) -> dict[str, TraceValue]:
        sampler = self._samplers.get(model_name) if model_name else None
        sampler = sampler or self._samplers[None]
        settings = sampler.settings
        shown: dict[str, TraceValue] = {
            "trace_level": list(settings.level),
            "trace_rate": str(settings.rate),
            "trace_count": str(sampler.remaining),
        }
        if self.startup.mode == "triton":
            shown["log_frequency"] = str(settings.log_frequency)
            shown["trace_file"] = self.startup.file
        shown["trace_mode"] = self.startup.mode
        shown.update(self.startup.mode_config())
        return shown

    def update(self, changes: Mapping[str, Any], model_name: str | None
               ) -> dict[str, TraceValue]:
        """Validate ``changes`` whole, apply them, and return the settings in force."""
        fields = _parse(changes, self.startup.mode)
        table = self._models.setdefault(model_name, {}) if model_name else self._global
        proposed = {**table, **fields}
        for name in [name for name, value in proposed.items() if value is None]:
            del proposed[name]
        settings = self._effective(proposed if not model_name else
                                   {**self._global, **proposed})
        self._check(settings)
        table.clear()
        table.update(proposed)
        self._rebuild(changed=model_name)
        return self.current(model_name)

    def _effective(self, fields: Mapping[str, Any]) -> Effective:
        default = self._default
        return Effective(
            level=fields.get("level", default.level),
            rate=fields.get("rate", default.rate),
            count=fields.get("count", default.count),
            log_frequency=fields.get("log_frequency", default.log_frequency))

    def _check(self, settings: Effective) -> None:
        """Only settings that trace nothing may be invalid, as in Triton."""
        if not settings.tracing:
            return
        reason = None
        if settings.rate == 0 and self.startup.mode == "triton":
            reason = "sample rate must be non-zero"
        elif self.startup.mode == "triton" and not self.startup.file:
            reason = "trace file name is not given"
        if reason is not None:
            raise invalid(f"Attempting to set invalid trace setting :{reason}")

    def _rebuild(self, changed: str | None) -> None:
        """Fresh samplers for what changed: the model's, or the global one and every model
        that falls back on it."""
        if changed is None:
            self._samplers[None] = Sampler(self._effective(self._global))
        for name, fields in list(self._models.items()):
            if not fields:
                del self._models[name]
                self._samplers.pop(name, None)
            elif changed is None or name == changed:
                self._samplers[name] = Sampler(self._effective({**self._global, **fields}))
        self.any_tracing = any(s.settings.tracing for s in self._samplers.values())


def _parse(changes: Mapping[str, Any], mode: str) -> dict[str, Any]:
    """The startup fields ``changes`` sets (None: back to the fallback)."""
    fields: dict[str, Any] = {}
    for key, value in changes.items():
        if key not in _KNOWN:
            raise invalid(f"unknown trace setting '{key}'; the settings are {', '.join(_KNOWN)}")
        if key == "trace_file":
            raise TritiumError(ErrorCode.UNSUPPORTED,
                               "trace file location can not be updated through network "
                               "protocol")
        if key == "trace_mode":
            if value is not None and value != mode:
                raise TritiumError(ErrorCode.UNSUPPORTED,
                                   "trace mode can not be updated through network protocol")
            continue
        field = _FIELDS[key]
        fields[field] = None if value is None else _value(key, field, value)
    return fields


def _value(key: str, field: str, value: Any) -> Any:
    if field == "level":
        return _levels(value)
    if not isinstance(value, str):
        raise invalid(f"trace setting '{key}' must be a string holding an integer")
    lowest, highest = _RANGES[field]
    try:
        return number(key, value, lowest, highest)
    except ValueError as exc:
        raise invalid(str(exc)) from None


def _levels(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise invalid("trace setting 'trace_level' must be a non-empty array of strings")
    unknown = [level for level in value if level not in LEVELS]
    if unknown:
        raise invalid(f"unknown trace level(s) {', '.join(unknown)}; the levels are "
                      f"{', '.join(LEVELS)}")
    if "OFF" in value:
        if len(value) != 1:
            raise invalid("Expect only one trace level 'OFF' is specified")
        return ("OFF",)
    return tuple(level for level in ("TIMESTAMPS", "TENSORS") if level in value)
