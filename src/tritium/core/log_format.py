"""How a log record is written: Triton's ``default`` and ``ISO8601`` formats, or ``json``,
one object per record for log collectors."""

from __future__ import annotations

import logging
import sys
from datetime import datetime, timezone
from typing import IO

import orjson

LINE = "%(asctime)s %(levelname)s %(name)s: %(message)s"
ISO8601_DATE = "%Y-%m-%dT%H:%M:%S%z"
# Attributes a log call may pass in ``extra`` that a JSON record carries as fields.
EXTRA_FIELDS = ("request_id", "model", "version", "cancel_reason", "cancel_stage")


class ServerFormatter(logging.Formatter):
    """One formatter whose ``mode`` the log settings switch at runtime."""

    def __init__(self, mode: str = "default"):
        super().__init__(LINE)
        self.mode = mode

    def format(self, record: logging.LogRecord) -> str:
        if self.mode == "json":
            return _json(record, self.formatException(record.exc_info)
                         if record.exc_info else None)
        self.datefmt = ISO8601_DATE if self.mode == "ISO8601" else None
        return super().format(record)


def _json(record: logging.LogRecord, exception: str | None) -> str:
    fields: dict[str, object] = {
        "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(
            timespec="microseconds").replace("+00:00", "Z"),
        "level": record.levelname,
        "logger": record.name,
        "message": record.getMessage(),
    }
    for name in EXTRA_FIELDS:
        value = record.__dict__.get(name)
        if value is not None:
            fields[name] = value if isinstance(value, (int, float, bool)) else str(value)
    if exception is not None:
        fields["exception"] = exception
    return orjson.dumps(fields).decode()


def install(mode: str, level: int, file: str | None) -> None:
    """The process's one log handler: standard error, or ``file`` (appended to)."""
    stream: IO[str] = sys.stderr if file is None else open(  # noqa: SIM115 - lives on
        file, "a", encoding="utf-8", buffering=1)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(ServerFormatter(mode))
    logging.basicConfig(level=level, handlers=[handler], force=True)
