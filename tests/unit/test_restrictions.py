"""Restricted API groups: the flag syntax, each protocol's group table, and the guards."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from types import SimpleNamespace
from typing import Any

import pytest
import tritonclient.grpc.service_pb2 as pb

from tritium.cli import parse_config
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.restrictions import ApiGroup, Restriction, parse_restriction, parse_restrictions
from tritium.frontends.grpc import restricted as grpc_restricted
from tritium.frontends.grpc.call import Rpc
from tritium.frontends.http import restricted as http_restricted
from tritium.frontends.http.handlers import ROUTES

# -- the flag ---------------------------------------------------------------------------------


def test_one_flag_restricts_each_listed_group_with_the_same_header() -> None:
    parsed = parse_restriction("inference,model-config:admin-key=secret")
    assert parsed == (Restriction(ApiGroup.INFERENCE, "admin-key", "secret"),
                      Restriction(ApiGroup.MODEL_CONFIG, "admin-key", "secret"))


def test_the_value_runs_to_the_end_and_may_hold_the_delimiters() -> None:
    (parsed,) = parse_restriction("health:k=a:b=c")
    assert (parsed.key, parsed.value) == ("k", "a:b=c")


def test_every_triton_group_name_is_accepted() -> None:
    names = ("health", "metadata", "inference", "shared-memory", "model-config",
             "model-repository", "statistics", "trace", "logging")
    parsed = parse_restrictions([f"{','.join(names)}:k=v"])
    assert [r.group.value for r in parsed] == list(names)


@pytest.mark.parametrize("spec", ["health", "health:k", "health:=v", ":k=v", "health:k=",
                                  "health=k:v", ""])
def test_a_malformed_restriction_is_refused(spec: str) -> None:
    with pytest.raises(ValueError, match=r"expected <api>\[,<api>...\]:<key>=<value>"):
        parse_restriction(spec)


@pytest.mark.parametrize("spec", ["inferences:k=v", "health,:k=v", "Health:k=v"])
def test_an_unknown_group_is_refused_with_the_allowed_names(spec: str) -> None:
    with pytest.raises(ValueError, match=r"unknown restricted protocol '.*' \(allowed: health, "):
        parse_restriction(spec, "protocol")


def test_a_key_that_is_no_header_name_is_refused() -> None:
    with pytest.raises(ValueError, match="'my key' is not a valid header name"):
        parse_restriction("health:my key=v")


@pytest.mark.parametrize("specs", [["health:a=b", "health,inference:c=d"], ["trace,trace:a=b"]])
def test_a_group_restricted_twice_is_refused(specs: list[str]) -> None:
    with pytest.raises(ValueError, match="can not be specified in multiple config groups"):
        parse_restrictions(specs)


def test_the_header_name_matches_in_any_case_and_the_value_exactly() -> None:
    (rule,) = parse_restriction("health:Admin-Key=Secret")
    assert rule.allows({"admin-key": "Secret"})
    assert not rule.allows({"admin-key": "secret"})
    assert not rule.allows({"admin-key": "Secret "})
    assert not rule.allows({})
    assert rule.allows({"triton-grpc-protocol-admin-key": "Secret"}, "triton-grpc-protocol-")


def test_the_command_line_fills_the_config() -> None:
    config = parse_config(["serve", "--http-restricted-api", "inference:a=b",
                           "--http-restricted-api", "health,metadata:c=d",
                           "--grpc-restricted-protocol", "logging:e=f"])
    assert [(r.group, r.key, r.value) for r in config.http_restricted_apis] == [
        (ApiGroup.INFERENCE, "a", "b"), (ApiGroup.HEALTH, "c", "d"), (ApiGroup.METADATA, "c", "d")]
    assert config.grpc_restricted_protocols == (Restriction(ApiGroup.LOGGING, "e", "f"),)
    assert parse_config(["serve"]).http_restricted_apis == ()


@pytest.mark.parametrize(("args", "fragment"), [
    (["--http-restricted-api", "everything:a=b"], "--http-restricted-api: unknown restricted api"),
    (["--grpc-restricted-protocol", "health"], "--grpc-restricted-protocol: expected <protocol>"),
    (["--grpc-restricted-protocol", "health:a=b", "--grpc-restricted-protocol", "health:c=d"],
     "restricted protocol 'health' can not be specified in multiple config groups"),
])
def test_a_bad_restriction_flag_stops_startup_in_one_line(args: list[str], fragment: str) -> None:
    with pytest.raises(SystemExit) as stopped:
        parse_config(["serve", *args])
    message = str(stopped.value)
    assert message.startswith("tritium: error: ") and "\n" not in message
    assert fragment in message


# -- HTTP: the group of each path -------------------------------------------------------------


def _sample(pattern: str) -> str:
    return pattern.replace("{model}", "m%2Fx")


def test_every_http_route_belongs_to_a_group() -> None:
    for _method, pattern, handler in ROUTES:
        assert http_restricted.group_of(_sample(pattern)) is not None, handler


@pytest.mark.parametrize(("path", "group"), [
    ("/v2/health/live", ApiGroup.HEALTH),
    ("/v2/health/ready", ApiGroup.HEALTH),
    ("/v2/models/m/ready", ApiGroup.HEALTH),
    ("/v2/models/m/versions/3/ready", ApiGroup.HEALTH),
    ("/v2", ApiGroup.METADATA),
    ("/v2/models/m", ApiGroup.METADATA),
    ("/v2/models/m/versions/2", ApiGroup.METADATA),
    ("/v2/models/m/infer", ApiGroup.INFERENCE),
    ("/v2/models/m/versions/1/generate", ApiGroup.INFERENCE),
    ("/v2/models/m/generate_stream", ApiGroup.INFERENCE),
    ("/v2/models/m/config", ApiGroup.MODEL_CONFIG),
    ("/v2/models/stats", ApiGroup.STATISTICS),
    ("/v2/models/m/versions/1/stats", ApiGroup.STATISTICS),
    ("/v2/repository/index", ApiGroup.MODEL_REPOSITORY),
    ("/v2/repository/models/m/load", ApiGroup.MODEL_REPOSITORY),
    ("/v2/repository/other/models/m/unload", ApiGroup.MODEL_REPOSITORY),
    ("/v2/systemsharedmemory/status", ApiGroup.SHARED_MEMORY),
    ("/v2/systemsharedmemory/region/r/register", ApiGroup.SHARED_MEMORY),
    ("/v2/cudasharedmemory/region/r/unregister", ApiGroup.SHARED_MEMORY),
    ("/v2/trace/setting", ApiGroup.TRACE),
    ("/v2/models/m/trace/setting", ApiGroup.TRACE),
    ("/v2/logging", ApiGroup.LOGGING),
])
def test_http_paths_fall_in_tritons_groups(path: str, group: ApiGroup) -> None:
    assert http_restricted.group_of(path) is group


@pytest.mark.parametrize("path", ["/", "/v1/models/m/infer", "/v2/", "/v2/models/m/infer/x",
                                  "/v2/models/m/bogus", "/v2/repository/models/m/delete",
                                  "/v2/health", "/metrics"])
def test_paths_of_no_endpoint_are_in_no_group(path: str) -> None:
    assert http_restricted.group_of(path) is None


def test_the_http_refusal_is_tritons_json() -> None:
    body = http_restricted.refusal(Restriction(ApiGroup.HEALTH, "Probe-Key", "v"))
    assert body == b'{"error":"This API is restricted, expecting header \'Probe-Key\'"}'


def test_without_restrictions_the_http_app_is_served_unwrapped() -> None:
    async def app(exchange: Any) -> None:
        return None

    assert http_restricted.restrict(app, ()) is app


# -- gRPC: the group of each method and the guarded router ------------------------------------


def _service_paths() -> list[str]:
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    return [f"/{service.full_name}/{m.name}" for m in service.methods]


def test_every_grpc_method_belongs_to_a_group() -> None:
    for path in [*_service_paths(), "/grpc.health.v1.Health/Check"]:
        grpc_restricted.group_of(path)  # raises for a method without a group


@pytest.mark.parametrize(("method", "group"), [
    ("ServerLive", ApiGroup.HEALTH), ("ModelReady", ApiGroup.HEALTH),
    ("ServerMetadata", ApiGroup.METADATA), ("ModelStreamInfer", ApiGroup.INFERENCE),
    ("ModelConfig", ApiGroup.MODEL_CONFIG), ("ModelStatistics", ApiGroup.STATISTICS),
    ("RepositoryModelLoad", ApiGroup.MODEL_REPOSITORY),
    ("CudaSharedMemoryRegister", ApiGroup.SHARED_MEMORY), ("TraceSetting", ApiGroup.TRACE),
    ("LogSettings", ApiGroup.LOGGING),
])
def test_grpc_methods_fall_in_tritons_groups(method: str, group: ApiGroup) -> None:
    assert grpc_restricted.group_of(f"/inference.GRPCInferenceService/{method}") is group


def test_a_method_without_a_group_is_never_served_unguarded() -> None:
    routes = {"/inference.GRPCInferenceService/NewMethod": Rpc(pb.ServerLiveRequest)}
    with pytest.raises(ValueError, match="belongs to no restricted protocol group"):
        grpc_restricted.restrict(routes, [Restriction(ApiGroup.HEALTH, "k", "v")])


async def _unary(request: Any, call: Any) -> str:
    return "served"


async def _stream(call: Any) -> None:
    call.served = True


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _routes() -> dict[str, Rpc]:
    return {
        "/inference.GRPCInferenceService/ModelInfer": Rpc(pb.ModelInferRequest, unary=_unary),
        "/inference.GRPCInferenceService/ModelStreamInfer": Rpc(pb.ModelInferRequest,
                                                                stream=_stream),
        "/inference.GRPCInferenceService/ServerLive": Rpc(pb.ServerLiveRequest, unary=_unary),
    }


def test_only_methods_of_restricted_groups_are_wrapped() -> None:
    routes = _routes()
    guarded = grpc_restricted.restrict(routes, [Restriction(ApiGroup.INFERENCE, "k", "v")])
    live = "/inference.GRPCInferenceService/ServerLive"
    assert guarded[live] is routes[live]
    infer = guarded["/inference.GRPCInferenceService/ModelInfer"]
    assert infer.unary is not _unary and infer.request_type is pb.ModelInferRequest
    assert grpc_restricted.restrict(routes, ()) is routes


@pytest.mark.parametrize("headers", [{}, {"triton-grpc-protocol-k": "w"}, {"k": "v"}])
def test_a_guarded_call_without_the_header_ends_unavailable(headers: dict[str, str]) -> None:
    guarded = grpc_restricted.restrict(_routes(), [Restriction(ApiGroup.INFERENCE, "k", "v")])
    call: Any = SimpleNamespace(headers=headers, served=False)  # what a handler reads of a Call
    expected = "This protocol is restricted, expecting header 'triton-grpc-protocol-k'"
    unary = guarded["/inference.GRPCInferenceService/ModelInfer"].unary
    stream = guarded["/inference.GRPCInferenceService/ModelStreamInfer"].stream
    assert unary is not None and stream is not None
    for attempt in (unary(None, call), stream(call)):
        with pytest.raises(TritiumError) as refused:
            asyncio.run(_awaited(attempt))
        assert (refused.value.code, refused.value.message) == (ErrorCode.UNAVAILABLE, expected)
    assert call.served is False


def test_a_guarded_call_with_the_header_is_served() -> None:
    guarded = grpc_restricted.restrict(_routes(), [Restriction(ApiGroup.INFERENCE, "k", "v")])
    call: Any = SimpleNamespace(headers={"triton-grpc-protocol-k": "v"}, served=False)
    unary = guarded["/inference.GRPCInferenceService/ModelInfer"].unary
    stream = guarded["/inference.GRPCInferenceService/ModelStreamInfer"].stream
    assert unary is not None and stream is not None
    assert asyncio.run(_awaited(unary(None, call))) == "served"
    asyncio.run(_awaited(stream(call)))
    assert call.served is True
