"""Request headers forwarded to the model as string parameters, as tritonserver's
``--http-header-forward-pattern`` / ``--grpc-header-forward-pattern`` do.

Patterns are RE2's, as in Triton: same syntax, and a match takes time linear in the name,
so no header a client sends can make matching backtrack (Python's ``re`` took seconds on
``.*trace.*`` against a 60,000-character name)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import re2

from tritium.core.errors import invalid
from tritium.core.request import InferenceRequest

# Parameter names a client may not set through a header: Triton's reserved keys, and every
# name of its own "triton_" family.
RESERVED_KEYS = frozenset({"sequence_id", "sequence_start", "sequence_end", "priority",
                           "timeout", "headers", "binary_data_output"})
RESERVED_PREFIX = "triton_"
# Triton matches case-insensitively: it puts this flag before the pattern, which may turn it
# off again with "(?-i)".
CASE_INSENSITIVE = "(?i)"


class PatternError(ValueError):
    """A forward pattern RE2 does not accept; the message says why."""


def _options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # a bad pattern is reported once, by the flag's parser
    return options


class HeaderForward:
    """Which header names become request parameters: those the pattern matches anywhere
    in the name (RE2 PartialMatch in Triton)."""

    __slots__ = ("_regex", "pattern")

    def __init__(self, pattern: str):
        self.pattern = pattern
        try:
            self._regex = re2.compile(CASE_INSENSITIVE + pattern, _options())
        except re2.error as exc:
            reason = exc.args[0] if exc.args else exc
            if isinstance(reason, bytes):
                reason = reason.decode(errors="replace")
            raise PatternError(str(reason)) from None

    def parameters(self, headers: Iterable[tuple[str, str]]) -> dict[str, str]:
        """The parameters ``headers`` give; INVALID_ARG for a matching reserved name."""
        found: dict[str, str] = {}
        search = self._regex.search
        for name, value in headers:
            if search(name) is None:
                continue
            if name in RESERVED_KEYS or name.startswith(RESERVED_PREFIX):
                raise invalid(f"Header '{name}' is reserved for Triton usage and cannot be "
                              "forwarded.")
            found[name] = value
        return found

    def apply(self, request: InferenceRequest, headers: Mapping[str, str]) -> None:
        """Add what ``headers`` forward to ``request``; a header wins over a body parameter
        of its name, as the later of Triton's two entries does in the model's view."""
        request.parameters.update(self.parameters(headers.items()))


def header_forward(pattern: str | None) -> HeaderForward | None:
    """None when no pattern is set (or it is empty, which Triton also takes as off)."""
    return HeaderForward(pattern) if pattern else None
