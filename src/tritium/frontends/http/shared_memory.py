"""HTTP system shared memory: the /v2/systemsharedmemory (and cudasharedmemory) endpoints,
and the ``shared_memory_*`` parameters of an /infer body's inputs and outputs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from tritium.core import messages
from tritium.core.errors import ErrorCode, TritiumError, invalid
from tritium.core.shared_memory import RegionStatus, SharedMemoryRegistry, Slice

if TYPE_CHECKING:
    from tritium.frontends.http.exchange import HttpExchange
    from tritium.frontends.http.handlers import HttpApi
    from tritium.frontends.http.routes import Match

_JSON = [("Content-Type", "application/json")]
# TritonJson's refusals, without the field name: the register handler passes them on bare.
_NOT_STRING = messages.JSON_NOT_STRING.partition(": ")[2]
_NOT_UNSIGNED = messages.JSON_NOT_UNSIGNED.partition(": ")[2]


# ------------------------------------------------------------------ tensor parameters


def input_slice(params: dict[str, Any], registry: SharedMemoryRegistry | None) -> Slice:
    """Where an input's bytes are, from its ``shared_memory_*`` parameters."""
    name, offset, byte_size = _parameters(params)
    return _registry(registry, name).slice(name, offset, byte_size)


def output_slice(params: dict[str, Any], registry: SharedMemoryRegistry | None) -> Slice:
    """Where an output goes. As Triton's ValidateOutputParameter: not also classified, nor
    asked for as binary data."""
    if "classification" in params:
        raise invalid(messages.SHM_HTTP_WITH_CLASSIFICATION)
    if "binary_data" in params:
        binary = params["binary_data"]
        if type(binary) is not bool:
            raise invalid(messages.JSON_SET_NOT_BOOL.format(key="binary_data"))
        if binary:
            raise invalid(messages.SHM_HTTP_WITH_BINARY)
    name, offset, byte_size = _parameters(params)
    return _registry(registry, name).output_slice(name, offset, byte_size)


def _parameters(params: dict[str, Any]) -> tuple[str, int, int]:
    name = params["shared_memory_region"]
    if type(name) is not str:
        raise invalid(messages.JSON_NOT_STRING.format(key="shared_memory_region"))
    return name, _unsigned(params, "shared_memory_offset"), \
        _unsigned(params, "shared_memory_byte_size")


def _unsigned(params: dict[str, Any], key: str) -> int:
    value = params.get(key, 0)
    if type(value) is not int or value < 0:
        raise invalid(messages.JSON_NOT_UNSIGNED.format(key=key))
    return value


def _registry(registry: SharedMemoryRegistry | None, name: str) -> SharedMemoryRegistry:
    if registry is None:  # a codec used without a server: no region is registered
        raise TritiumError(ErrorCode.NOT_FOUND, messages.SHM_UNKNOWN_REGION.format(name=name))
    return registry


# -------------------------------------------------------------------------- endpoints


async def system_status(api: HttpApi, exchange: HttpExchange, match: Match) -> None:
    _respond(exchange, [_status_json(s) for s in api.shared_memory.status(match.model or "")])


async def system_register(api: HttpApi, exchange: HttpExchange, match: Match) -> None:
    registry = api.shared_memory
    if not registry.enabled:
        raise TritiumError(ErrorCode.UNSUPPORTED, messages.SHM_DISABLED)
    name = match.model or ""
    if not name:
        raise invalid(messages.SHM_NEEDS_NAME)
    registry.register(name, *_register_body(exchange.request.body))
    exchange.respond(200, _JSON, b"")


async def system_unregister(api: HttpApi, exchange: HttpExchange, match: Match) -> None:
    if match.model:
        api.shared_memory.unregister(match.model)
    else:
        api.shared_memory.unregister_all()
    exchange.respond(200, _JSON, b"")


async def cuda_status(api: HttpApi, exchange: HttpExchange, match: Match) -> None:
    _respond(exchange, [_status_json(s) for s in api.shared_memory.cuda_status(match.model or "")])


async def cuda_register(api: HttpApi, exchange: HttpExchange, match: Match) -> None:
    if not api.shared_memory.enabled:
        raise TritiumError(ErrorCode.UNSUPPORTED, messages.SHM_DISABLED)
    if not match.model:
        raise invalid(messages.CUDA_SHM_NEEDS_NAME)
    api.shared_memory.register_cuda(match.model)


async def cuda_unregister(api: HttpApi, exchange: HttpExchange, match: Match) -> None:
    api.shared_memory.unregister_cuda(match.model or "")
    exchange.respond(200, _JSON, b"")


def _register_body(body: bytes | memoryview) -> tuple[str, int, int]:
    """``key``, ``offset`` (default 0) and ``byte_size`` of a register request; an empty
    body is an empty object, as Triton reads it."""
    doc = _json_object(body)
    if "key" not in doc:
        raise invalid(messages.SHM_NO_FIELD.format(field="key"))
    key = doc["key"]
    if type(key) is not str:
        raise invalid(_NOT_STRING)
    offset = doc.get("offset", 0)
    if type(offset) is not int or offset < 0:
        raise invalid(_NOT_UNSIGNED)
    if "byte_size" not in doc:
        raise invalid(messages.SHM_NO_FIELD.format(field="byte_size"))
    byte_size = doc["byte_size"]
    if type(byte_size) is not int or byte_size < 0:
        raise invalid(_NOT_UNSIGNED)
    return key, offset, byte_size


def _json_object(body: bytes | memoryview) -> dict[str, Any]:
    if not body:
        return {}
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise invalid(f"failed to parse the request JSON buffer: {exc}") from None
    if type(doc) is not dict:
        raise invalid("failed to parse the request JSON buffer: the document is not an object")
    return doc


def _status_json(status: RegionStatus) -> dict[str, Any]:
    return {"name": status.name, "key": status.key, "offset": status.offset,
            "byte_size": status.byte_size}


def _respond(exchange: HttpExchange, payload: Any) -> None:
    exchange.respond(200, _JSON, orjson.dumps(payload))
