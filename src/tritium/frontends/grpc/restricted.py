"""Restricted gRPC protocols: each method's group, and a router whose restricted methods end
UNAVAILABLE unless the call carries ``triton-grpc-protocol-<key>: <value>``."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.restrictions import ApiGroup, Restriction, by_group
from tritium.frontends.grpc.call import Call, Router, Rpc, StreamHandler, UnaryHandler

# tritonserver puts this before the key a flag names; gRPC metadata keys are lower case.
HEADER_PREFIX = "triton-grpc-protocol-"

_GROUPS: dict[ApiGroup, tuple[str, ...]] = {
    ApiGroup.HEALTH: ("ServerLive", "ServerReady", "ModelReady", "Check"),
    ApiGroup.METADATA: ("ServerMetadata", "ModelMetadata"),
    ApiGroup.INFERENCE: ("ModelInfer", "ModelStreamInfer"),
    ApiGroup.MODEL_CONFIG: ("ModelConfig",),
    ApiGroup.STATISTICS: ("ModelStatistics",),
    ApiGroup.MODEL_REPOSITORY: ("RepositoryIndex", "RepositoryModelLoad",
                                "RepositoryModelUnload"),
    ApiGroup.SHARED_MEMORY: tuple(f"{kind}SharedMemory{action}"
                                  for kind in ("System", "Cuda")
                                  for action in ("Status", "Register", "Unregister")),
    ApiGroup.TRACE: ("TraceSetting",),
    ApiGroup.LOGGING: ("LogSettings",),
}
_GROUP_BY_METHOD = {method: group for group, methods in _GROUPS.items() for method in methods}


def group_of(path: str) -> ApiGroup:
    """The group of a routed method, by its ``:path`` ("/<service>/<method>")."""
    method = path.rpartition("/")[2]
    try:
        return _GROUP_BY_METHOD[method]
    except KeyError:
        # A method added to the router must be given a group: never serve it unguarded.
        raise ValueError(f"gRPC method {path} belongs to no restricted protocol group") from None


def refusal(restriction: Restriction) -> TritiumError:
    return TritiumError(
        ErrorCode.UNAVAILABLE,
        f"This protocol is restricted, expecting header '{HEADER_PREFIX}{restriction.key}'")


def restrict(routes: Router, restrictions: Iterable[Restriction]) -> Router:
    """``routes`` with each method of a restricted group checking its call's headers first."""
    table = by_group(restrictions)
    if not table:
        return routes
    guarded: Router = {}
    for path, rpc in routes.items():
        restriction = table.get(group_of(path))
        guarded[path] = rpc if restriction is None else _guard(rpc, restriction)
    return guarded


def _guard(rpc: Rpc, restriction: Restriction) -> Rpc:
    changes: dict[str, Any] = {}
    if rpc.unary is not None:
        changes["unary"] = _guard_unary(rpc.unary, restriction)
    if rpc.stream is not None:
        changes["stream"] = _guard_stream(rpc.stream, restriction)
    return dataclasses.replace(rpc, **changes)


def _guard_unary(handler: UnaryHandler, restriction: Restriction) -> UnaryHandler:
    async def unary(request: Any, call: Call) -> Any:
        if not restriction.allows(call.headers, HEADER_PREFIX):
            raise refusal(restriction)
        return await handler(request, call)

    return unary


def _guard_stream(handler: StreamHandler, restriction: Restriction) -> StreamHandler:
    # Checked before a message is read: the stream ends at once, as tritonserver ends it.
    async def stream(call: Call) -> None:
        if not restriction.allows(call.headers, HEADER_PREFIX):
            raise refusal(restriction)
        await handler(call)

    return stream
