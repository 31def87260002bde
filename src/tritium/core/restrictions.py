"""API groups that can be closed to requests lacking a header, and the flag text that says so."""

from __future__ import annotations

import enum
import hmac
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


class ApiGroup(enum.Enum):
    """Triton's restricted-feature categories, by the names its flags take."""

    HEALTH = "health"
    METADATA = "metadata"
    INFERENCE = "inference"
    SHARED_MEMORY = "shared-memory"
    MODEL_CONFIG = "model-config"
    MODEL_REPOSITORY = "model-repository"
    STATISTICS = "statistics"
    TRACE = "trace"
    LOGGING = "logging"
    # tritium's own: the read-only live page on the metrics port (/live, /live/state).
    LIVE = "live"


# Groups of HTTP paths only (the metrics port's page): no gRPC method belongs to them, so
# naming one in a gRPC restriction is refused rather than silently doing nothing.
_HTTP_ONLY = frozenset({ApiGroup.LIVE})
GROUP_NAMES = ", ".join(group.value for group in ApiGroup)
PROTOCOL_NAMES = ", ".join(group.value for group in ApiGroup if group not in _HTTP_ONLY)

# RFC 9110 token characters: a header name outside them could never be sent, so the
# restricted group would be closed to everyone.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")


@dataclass(frozen=True, slots=True)
class Restriction:
    """Requests to ``group`` are served only when they carry header ``key`` with ``value``.

    ``key`` is as the flag gave it; a frontend may put a prefix before it (gRPC does).
    """

    group: ApiGroup
    key: str
    value: str
    lookup: str = field(init=False, repr=False, compare=False)
    _expected: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "lookup", self.key.lower())
        object.__setattr__(self, "_expected", _bytes(self.value))

    def allows(self, headers: Mapping[str, str], prefix: str = "") -> bool:
        """Whether ``headers`` (names in lower case) carry the expected value exactly."""
        given = headers.get(prefix + self.lookup)
        # The value is a shared secret: compare in constant time, so response timing does
        # not reveal how much of a guess was right.
        return given is not None and hmac.compare_digest(_bytes(given), self._expected)


def parse_restriction(spec: str, feature: str = "api") -> tuple[Restriction, ...]:
    """``<group>[,<group>...]:<key>=<value>`` → one restriction per group.

    As tritonserver reads it: the groups end at the first ``:``, the key at the first ``=``
    after it, and the value (which may hold ``:`` and ``=``) runs to the end.
    """
    groups, colon, setting = spec.partition(":")
    key, equals, value = setting.partition("=")
    if not (colon and equals and groups and key and value):
        raise ValueError(f"expected <{feature}>[,<{feature}>...]:<key>=<value>, got '{spec}'")
    if not _TOKEN.match(key):
        raise ValueError(f"'{key}' is not a valid header name")
    return tuple(Restriction(_group(name, feature), key, value) for name in groups.split(","))


def parse_restrictions(specs: Iterable[str], feature: str = "api") -> tuple[Restriction, ...]:
    """Every flag's restrictions; a group may be restricted by one flag value only."""
    seen: set[ApiGroup] = set()
    result: list[Restriction] = []
    for spec in specs:
        for restriction in parse_restriction(spec, feature):
            if restriction.group in seen:
                raise ValueError(f"restricted {feature} '{restriction.group.value}' can not be "
                                 f"specified in multiple config groups")
            seen.add(restriction.group)
            result.append(restriction)
    return tuple(result)


def by_group(restrictions: Iterable[Restriction]) -> dict[ApiGroup, Restriction]:
    return {restriction.group: restriction for restriction in restrictions}


def _bytes(text: str) -> bytes:
    # surrogatepass: a command-line argument that is not UTF-8 arrives holding surrogates.
    return text.encode("utf-8", "surrogatepass")


def _group(name: str, feature: str) -> ApiGroup:
    """``feature`` is "protocol" for gRPC's groups, which lack the HTTP-only ones."""
    grpc = feature == "protocol"
    try:
        group = ApiGroup(name)
    except ValueError:
        group = None
    if group is None or (grpc and group in _HTTP_ONLY):
        allowed = PROTOCOL_NAMES if grpc else GROUP_NAMES
        raise ValueError(f"unknown restricted {feature} '{name}' (allowed: {allowed})")
    return group
