"""Which requests the current model code is executing, for BLS parents and get_model_dir."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING

import msgspec

from tritium.core.request import AdmittedRequest
from tritium.core.response import model_scope

if TYPE_CHECKING:
    from tritium.backends.python.link import ServerLink


class Phase(enum.Enum):
    """Which of the model's functions is running: BLS works only in ``execute``."""

    AUTO_COMPLETE = "auto_complete_config"
    INITIALIZE = "initialize"
    EXECUTE = "execute"
    FINALIZE = "finalize"


class ExecutionScope(msgspec.Struct):
    """Set around a model's execute: a ContextVar follows both its thread and its asyncio
    tasks, so a BLS call made from there finds its parents without being told. One is made
    per execute: a Struct, built in C (no Python __init__)."""

    link: ServerLink | None  # how this model's code reaches the server
    model_dir: str
    requests: Sequence[AdmittedRequest] = ()
    phase: Phase = Phase.EXECUTE


# The core's own: what model code sends itself is never held back (core.response).
_current: ContextVar[ExecutionScope | None] = model_scope
# Threads a model starts itself do not inherit context variables; their BLS calls use the
# link of the most recently created python instance (one server per process, and one
# link per instance process) and have no parent to follow.
_fallback_link: ServerLink | None = None


# The context variable's own methods: entered and left around every execute, in C.
enter: Callable[[ExecutionScope], Token[ExecutionScope | None]] = _current.set
leave: Callable[[Token[ExecutionScope | None]], None] = _current.reset


def current() -> ExecutionScope | None:
    return _current.get()


def register_link(link: ServerLink | None) -> None:
    """The link for model code outside any scope (threads the model started)."""
    global _fallback_link
    _fallback_link = link


def current_link() -> ServerLink | None:
    scope = _current.get()
    if scope is not None and scope.link is not None:
        return scope.link
    return _fallback_link


def current_parents() -> Sequence[AdmittedRequest]:
    scope = _current.get()
    return () if scope is None else scope.requests


def current_phase() -> Phase | None:
    """None outside model code run by the backend (a thread the model started, say)."""
    scope = _current.get()
    return None if scope is None else scope.phase
