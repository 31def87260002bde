"""Log and trace settings a client reads and changes at runtime (Triton's logging and trace
extensions): validated here once, for both protocols, and applied to Python logging."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from tritium.core.errors import ErrorCode, TritiumError, invalid
from tritium.core.log_format import ServerFormatter

LogValue = bool | int | str
TraceValue = str | list[str]

SERVER_LOGGER = "tritium"  # the server logs through tritium.*, models through tritium.model
LOG_SETTING_TYPES: Mapping[str, type] = {
    "log_file": str,
    "log_info": bool,
    "log_warning": bool,
    "log_error": bool,
    "log_verbose_level": int,
    "log_format": str,
}
LOG_FORMATS = ("default", "ISO8601", "json")
ISO8601_DATE = "%Y-%m-%dT%H:%M:%S%z"
UINT32_MAX = 2**32 - 1


class _HiddenLevels(logging.Filter):
    """Drops the server's records at the levels the settings switch off.

    It sits on the handlers, not on the server logger: a logger's filters never see the
    records its children (tritium.http, tritium.model, ...) pass up to it.
    """

    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix
        self.hidden: frozenset[int] = frozenset()  # replaced whole, so threads read it unlocked

    def filter(self, record: logging.LogRecord) -> bool:
        if _band(record.levelno) not in self.hidden:
            return True
        name = record.name
        return not (name == self.prefix or name.startswith(self.prefix + "."))


def _band(level: int) -> int:
    """The standard level a custom one belongs to (CRITICAL counts as ERROR)."""
    for band in (logging.ERROR, logging.WARNING, logging.INFO):
        if level >= band:
            return band
    return logging.DEBUG


class LogSettings:
    """The server's log settings; ``update`` validates a change whole, then applies it.

    Nothing is applied before the first ``update`` with changes, so building one (as every
    ``InferenceService`` does) leaves the process's logging alone.
    """

    def __init__(self, logger: logging.Logger | None = None):
        self.logger = logger if logger is not None else logging.getLogger(SERVER_LOGGER)
        self.info = True
        self.warning = True
        self.error = True
        self.verbose_level = 0
        self.format = "default"
        self.file = ""  # set once at startup (--log-file); the protocol cannot change it
        self._filter = _HiddenLevels(self.logger.name)
        self._default_datefmt: dict[logging.Formatter, str | None] = {}

    def current(self) -> dict[str, LogValue]:
        return {
            "log_file": self.file,
            "log_info": self.info,
            "log_warning": self.warning,
            "log_error": self.error,
            "log_verbose_level": self.verbose_level,
            "log_format": self.format,
        }

    def update(self, changes: Mapping[str, Any]) -> dict[str, LogValue]:
        """Apply ``changes`` (a subset of the settings; None leaves one as it is) and return
        the settings now in force. Nothing changes when any entry is refused."""
        for key, value in changes.items():
            _check_log_setting(key, value)
        given = {key: value for key, value in changes.items() if value is not None}
        if not given:
            return self.current()
        self.info = given.get("log_info", self.info)
        self.warning = given.get("log_warning", self.warning)
        self.error = given.get("log_error", self.error)
        self.verbose_level = given.get("log_verbose_level", self.verbose_level)
        self.format = given.get("log_format", self.format)
        self.apply()
        return self.current()

    def apply(self) -> None:
        """Make Python logging match the settings."""
        hidden = {logging.INFO: not self.info, logging.WARNING: not self.warning,
                  logging.ERROR: not self.error}
        self._filter.hidden = frozenset(level for level, off in hidden.items() if off)
        self.logger.setLevel(logging.DEBUG if self.verbose_level > 0 else logging.INFO)
        for handler in self._handlers():
            handler.addFilter(self._filter)  # no-op when already there
            if handler.formatter is not None:  # without one, records carry no date
                self._set_date_format(handler.formatter)

    def _handlers(self) -> list[logging.Handler]:
        """Every handler the server logger's records reach now (one added later gets the
        filter at the next ``apply``)."""
        handlers: list[logging.Handler] = []
        logger: logging.Logger | None = self.logger
        while logger is not None:
            handlers.extend(logger.handlers)
            logger = logger.parent if logger.propagate else None
        return handlers

    def _set_date_format(self, formatter: logging.Formatter) -> None:
        if isinstance(formatter, ServerFormatter):
            formatter.mode = self.format
            return
        default = self._default_datefmt.setdefault(formatter, formatter.datefmt)
        formatter.datefmt = ISO8601_DATE if self.format == "ISO8601" else default


def _check_log_setting(key: str, value: Any) -> None:
    expected = LOG_SETTING_TYPES.get(key)
    if expected is None:
        known = ", ".join(LOG_SETTING_TYPES)
        raise invalid(f"unknown log setting '{key}'; the settings are {known}")
    if value is None:
        return
    if key == "log_file":
        raise TritiumError(ErrorCode.UNSUPPORTED,
                           "log_file cannot be changed through the network protocol")
    # bool is an int subclass: a boolean level, or a 0/1 flag, is a wrong type here.
    if type(value) is not expected:
        raise invalid(f"log setting '{key}' must be {_TYPE_NAMES[expected]}, "
                      f"got {type(value).__name__}")
    if key == "log_verbose_level" and not (isinstance(value, int) and 0 <= value <= UINT32_MAX):
        raise invalid(f"log setting 'log_verbose_level' must be an unsigned 32-bit integer, "
                      f"got {value}")
    if key == "log_format" and value not in LOG_FORMATS:
        raise invalid(f"log setting 'log_format' must be one of {', '.join(LOG_FORMATS)}, "
                      f"got '{value}'")


_TYPE_NAMES = {bool: "a boolean", int: "an unsigned integer", str: "a string"}


# ----------------------------------------------------------------------------- trace

# Trace settings are the tracer's (tracing/control.py); the protocols only need to know which
# of them hold a list of strings (the rest hold one string each).
LIST_TRACE_SETTINGS = frozenset({"trace_level"})
