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
from tritium.execution.process.messages import LogRecordBody

if TYPE_CHECKING:
    from tritium.execution.process.calls import CallContext, ChildLink, Handler

LOG = "log"

async def serve_log(ctx: CallContext, payload: Any, buffers: list[memoryview]) -> None:
    emit(convert(LogRecordBody, payload))
    ctx.reply(None, final=True)


def emit(sent: LogRecordBody) -> None:
    """Write a forwarded record through the server logger of the same name (only under
    the ``tritium`` tree)."""
    if sent.name != SERVER_LOGGER and not sent.name.startswith(SERVER_LOGGER + "."):
        raise TritiumError(ErrorCode.INVALID_ARG, "log records come from the tritium tree")
    target = logging.getLogger(sent.name)
    if target.isEnabledFor(sent.levelno):
        fields = {name: getattr(sent, name) for name in _FIELDS}
        fields["args"] = None
        target.handle(logging.makeLogRecord(fields))


HANDLERS: dict[str, Handler] = {LOG: serve_log}

_FIELDS = LogRecordBody.__struct_fields__


def record_body(record: logging.LogRecord) -> LogRecordBody:
    """What crosses of a record: its message formatted, since its arguments may be
    anything (the codec carries plain values only), and its traceback as text."""
    if record.exc_info and not record.exc_text:
        record.exc_text = logging.Formatter().formatException(record.exc_info)
    return LogRecordBody(
        name=record.name, levelno=record.levelno, levelname=record.levelname,
        msg=record.getMessage(), pathname=record.pathname, filename=record.filename,
        module=record.module, lineno=record.lineno, funcName=record.funcName,
        created=record.created, msecs=record.msecs, relativeCreated=record.relativeCreated,
        thread=record.thread, threadName=record.threadName, process=record.process,
        processName=record.processName, stack_info=record.stack_info,
        exc_text=record.exc_text)


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
            self._link.call(LOG, record_body(record))
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
