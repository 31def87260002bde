"""Restricted HTTP APIs: which group a path belongs to, and the 403 for a request without the
header its group asks for."""

from __future__ import annotations

import re
from collections.abc import Iterable

import orjson

from tritium.core.restrictions import ApiGroup, Restriction, by_group
from tritium.frontends.http.exchange import App, HttpExchange

_JSON = [("Content-Type", "application/json")]

# The group is told by the path alone, before the method is looked at, as tritonserver does:
# a wrong method on a restricted path is refused 403, not 405. Patterns follow tritonserver's
# URL shapes; the version segment takes what our router takes.
_MODEL = re.compile(r"/v2/models/[^/]+(?:/versions/[^/]*)?(?P<kind>/[a-z_/]+)?\Z")
_MODEL_KINDS: dict[str | None, ApiGroup] = {
    None: ApiGroup.METADATA,
    "/ready": ApiGroup.HEALTH,
    "/infer": ApiGroup.INFERENCE,
    "/generate": ApiGroup.INFERENCE,
    "/generate_stream": ApiGroup.INFERENCE,
    "/config": ApiGroup.MODEL_CONFIG,
    "/stats": ApiGroup.STATISTICS,
    "/trace/setting": ApiGroup.TRACE,
}
_EXACT: dict[str, ApiGroup] = {
    "/v2": ApiGroup.METADATA,
    "/v2/health/live": ApiGroup.HEALTH,
    "/v2/health/ready": ApiGroup.HEALTH,
    "/v2/models/stats": ApiGroup.STATISTICS,
    "/v2/logging": ApiGroup.LOGGING,
    "/v2/trace/setting": ApiGroup.TRACE,
    # OpenAI's API: restricted with the groups of their /v2 counterparts.
    "/v1/models": ApiGroup.METADATA,
    "/v1/completions": ApiGroup.INFERENCE,
    "/v1/chat/completions": ApiGroup.INFERENCE,
}
_PATTERNS: tuple[tuple[re.Pattern[str], ApiGroup], ...] = (
    (re.compile(r"/v2/(?:system|cuda)sharedmemory(?:/region/[^/]+)?"
                r"/(?:status|register|unregister)\Z"), ApiGroup.SHARED_MEMORY),
    (re.compile(r"/v2/repository(?:/[^/]+)?/(?:index|models/[^/]+/(?:load|unload))\Z"),
     ApiGroup.MODEL_REPOSITORY),
    (re.compile(r"/v1/models/[^/]+\Z"), ApiGroup.METADATA),
)


def group_of(path: str) -> ApiGroup | None:
    """The API group of a request path (still percent-encoded); None for no endpoint."""
    group = _EXACT.get(path)
    if group is not None:
        return group
    found = _MODEL.match(path)
    if found is not None:
        return _MODEL_KINDS.get(found["kind"])
    for pattern, pattern_group in _PATTERNS:
        if pattern.match(path):
            return pattern_group
    return None


def refusal(restriction: Restriction) -> bytes:
    """tritonserver's 403 body for a request without the expected header."""
    message = f"This API is restricted, expecting header '{restriction.key}'"
    return orjson.dumps({"error": message})


class RestrictedApp:
    """Serves a request only when its group's header is present with the expected value;
    requests to unrestricted groups (and to no endpoint at all) go straight through."""

    def __init__(self, app: App, restrictions: Iterable[Restriction]):
        self._app = app
        self._restrictions = by_group(restrictions)
        self._refusals = {group: refusal(r) for group, r in self._restrictions.items()}

    async def __call__(self, exchange: HttpExchange) -> None:
        request = exchange.request
        group = group_of(request.path)
        if group is not None:
            restriction = self._restrictions.get(group)
            if restriction is not None and not restriction.allows(request.headers):
                exchange.respond(403, _JSON, self._refusals[group])
                return
        await self._app(exchange)


def restrict(app: App, restrictions: Iterable[Restriction]) -> App:
    """``app`` behind the restrictions; ``app`` itself when there are none."""
    chosen = tuple(restrictions)
    return RestrictedApp(app, chosen) if chosen else app
