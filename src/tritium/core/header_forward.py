"""Request headers forwarded to the model as string parameters, as tritonserver's
``--http-header-forward-pattern`` / ``--grpc-header-forward-pattern`` do."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from tritium.core.errors import invalid
from tritium.core.request import InferenceRequest

# Parameter names a client may not set through a header: Triton's reserved keys, and every
# name of its own "triton_" family.
RESERVED_KEYS = frozenset({"sequence_id", "sequence_start", "sequence_end", "priority",
                           "timeout", "headers", "binary_data_output"})
RESERVED_PREFIX = "triton_"
# Triton matches case-insensitively unless the pattern itself turns that off this way.
CASE_SENSITIVE_PREFIX = "(?-i)"


class HeaderForward:
    """Which header names become request parameters: those the pattern matches anywhere
    in the name (RE2 PartialMatch in Triton)."""

    __slots__ = ("_regex", "pattern")

    def __init__(self, pattern: str):
        self.pattern = pattern
        flags = re.IGNORECASE
        if pattern.startswith(CASE_SENSITIVE_PREFIX):
            # Python takes flags only at the very start; Triton prepends "(?i)" to the flag.
            pattern, flags = pattern[len(CASE_SENSITIVE_PREFIX):], re.NOFLAG
        self._regex = re.compile(pattern, flags)  # re.error: the flag is refused at startup

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
