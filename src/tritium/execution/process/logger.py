"""Log records of an instance process (``pb_utils.Logger`` and tritium's own loggers)
handed to the server's logging, so they read exactly as a thread instance's.

The child forwards every record of the ``tritium`` logger tree, DEBUG included; the
server's logger then decides, with the settings in force at that moment (``--log-verbose``,
the logging extension's levels and format), whether and how the line is written.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.logging_settings import SERVER_LOGGER
from tritium.execution.process.codec import convert

if TYPE_CHECKING:
    from tritium.execution.process.calls import CallContext, ChildLink, Handler

LOG = "log"

# The record's attributes that formatters read; the message is sent formatted, since its
# arguments may be anything (the codec carries plain values only).
_FIELDS = ("name", "levelno", "levelname", "pathname", "filename", "module", "lineno",
           "funcName", "created", "msecs", "relativeCreated", "thread", "threadName",
           "process", "processName", "stack_info")


async def serve_log(ctx: CallContext, payload: Any, buffers: list[memoryview]) -> None:
    emit(payload)
    ctx.reply(None, final=True)


def emit(payload: Any) -> None:
    """Write a forwarded record through the server logger of the same name (only the
    attributes a record of ours carries, and only under the ``tritium`` tree)."""
    sent = convert(dict[str, Any], payload)
    fields = {name: sent.get(name) for name in (*_FIELDS, "msg", "exc_text")}
    fields["args"] = None
    if not isinstance(fields["name"], str) or not isinstance(fields["levelno"], int):
        raise TritiumError(ErrorCode.INVALID_ARG, "a log record needs a name and a level")
    if fields["name"] != SERVER_LOGGER and not fields["name"].startswith(SERVER_LOGGER + "."):
        raise TritiumError(ErrorCode.INVALID_ARG, "log records come from the tritium tree")
    target = logging.getLogger(fields["name"])
    if target.isEnabledFor(fields["levelno"]):
        target.handle(logging.makeLogRecord(fields))


HANDLERS: dict[str, Handler] = {LOG: serve_log}


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = {name: getattr(record, name, None) for name in _FIELDS}
    fields["msg"] = record.getMessage()
    fields["args"] = None
    if record.exc_info and not record.exc_text:
        record.exc_text = logging.Formatter().formatException(record.exc_info)
    fields["exc_text"] = record.exc_text
    return fields


class ForwardingHandler(logging.Handler):
    """In the instance process: each record becomes a call to the server (not awaited)."""

    def __init__(self, link: ChildLink):
        super().__init__(logging.DEBUG)
        self._link = link
        self._inside = threading.local()

    def emit(self, record: logging.LogRecord) -> None:
        # The link may log itself: a record it writes while forwarding one is dropped.
        if getattr(self._inside, "active", False):
            return
        self._inside.active = True
        try:
            self._link.call(LOG, record_fields(record))
        except Exception:
            self.handleError(record)
        finally:
            self._inside.active = False


def forward_logs(link: ChildLink) -> None:
    """In the instance process: the server writes this process's log lines."""
    server_logger = logging.getLogger(SERVER_LOGGER)
    server_logger.addHandler(ForwardingHandler(link))
    server_logger.setLevel(logging.DEBUG)
    server_logger.propagate = False  # the server writes the line; the child's stderr not
