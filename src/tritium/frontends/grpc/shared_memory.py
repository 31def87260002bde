"""gRPC system shared memory: the ``shared_memory_*`` parameters of a ModelInferRequest's
inputs and outputs, and the status messages of the SystemSharedMemory* methods."""

from __future__ import annotations

from typing import Any

from tritonclient.grpc import service_pb2 as pb

from tritium.core import messages
from tritium.core.errors import ErrorCode, TritiumError, invalid
from tritium.core.shared_memory import RegionStatus, SharedMemoryRegistry, Slice

REGION = "shared_memory_region"
_OFFSET = "shared_memory_offset"
_BYTE_SIZE = "shared_memory_byte_size"


def input_slice(item: Any, model_name: str, registry: SharedMemoryRegistry | None
                ) -> Slice | None:
    """Where an input's bytes are; None when its parameters name no region."""
    found = _parameters(item)
    if found is None:
        return None
    if item.HasField("contents"):
        raise invalid(messages.SHM_GRPC_WITH_CONTENTS.format(tensor=item.name,
                                                              model=model_name))
    return _registry(registry, found[0]).slice(*found)


def output_slice(item: Any, registry: SharedMemoryRegistry | None) -> Slice | None:
    """Where an output goes; None when its parameters name no region."""
    found = _parameters(item)
    if found is None:
        return None
    if "classification" in item.parameters:
        raise invalid(messages.SHM_GRPC_WITH_CLASSIFICATION)
    return _registry(registry, found[0]).output_slice(*found)


def _parameters(item: Any) -> tuple[str, int, int] | None:
    """As Triton's ParseSharedMemoryParams: region a string_param, offset and byte size
    int64_params that need the region."""
    params = item.parameters
    region = params.get(REGION)
    if region is not None and region.WhichOneof("parameter_choice") != "string_param":
        raise invalid(messages.SHM_GRPC_WRONG_TYPE.format(key=REGION, tensor=item.name,
                                                          expected="string_param"))
    offset = _int64(params, _OFFSET, item.name, region is not None)
    byte_size = _int64(params, _BYTE_SIZE, item.name, region is not None)
    if region is None:
        return None
    return region.string_param, offset, byte_size


def _int64(params: Any, key: str, tensor: str, has_region: bool) -> int:
    value = params.get(key)
    if value is None:
        return 0
    if not has_region:
        raise invalid(messages.SHM_GRPC_WITHOUT_REGION.format(key=key, tensor=tensor))
    if value.WhichOneof("parameter_choice") != "int64_param":
        raise invalid(messages.SHM_GRPC_WRONG_TYPE.format(key=key, tensor=tensor,
                                                          expected="int64_param"))
    result: int = value.int64_param
    return result


def _registry(registry: SharedMemoryRegistry | None, name: str) -> SharedMemoryRegistry:
    if registry is None:  # a codec used without a server: no region is registered
        raise TritiumError(ErrorCode.NOT_FOUND, messages.SHM_UNKNOWN_REGION.format(name=name))
    return registry


def system_status(regions: list[RegionStatus]) -> pb.SystemSharedMemoryStatusResponse:
    message = pb.SystemSharedMemoryStatusResponse()
    for region in regions:
        message.regions[region.name].CopyFrom(pb.SystemSharedMemoryStatusResponse.RegionStatus(
            name=region.name, key=region.key, offset=region.offset,
            byte_size=region.byte_size))
    return message
