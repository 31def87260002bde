"""The grpc.aio server that carries the KServe v2 gRPC service on the server's event loop."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2_grpc
from tritonclient.grpc import service_pb2_grpc

from tritium.core.service import InferenceService
from tritium.frontends.grpc.servicer import HealthServicer, InferenceServicer

# Triton accepts messages up to INT32_MAX both ways; -1 lifts gRPC's 4 MiB default.
SERVER_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    # A second server on a port already taken must fail, not silently share it.
    ("grpc.so_reuseport", 0),
]


class GrpcServer:
    """A started gRPC endpoint; ``port`` is the bound port (useful when asked for 0)."""

    def __init__(self, server: grpc.aio.Server, servicer: InferenceServicer, port: int):
        self._server = server
        self.servicer = servicer
        self.port = port

    async def stop(self, grace: float) -> None:
        """Refuse new RPCs, give running ones ``grace`` seconds, then cancel the rest."""
        self.servicer.stopping = True
        await self._server.stop(grace)


async def start_grpc_server(service: InferenceService, address: str, port: int) -> GrpcServer:
    """Bind ``address:port`` and start serving on the running event loop."""
    server = grpc.aio.server(options=SERVER_OPTIONS)
    servicer = InferenceServicer(service)
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(service), server)
    target = _target(address, port)
    try:
        bound = server.add_insecure_port(target)
    except RuntimeError as exc:  # grpc reports a failed bind this way
        raise OSError(f"gRPC endpoint cannot bind {target}: {exc}") from None
    if bound == 0:
        raise OSError(f"gRPC endpoint cannot bind {target}")
    await server.start()
    return GrpcServer(server, servicer, bound)


def _target(address: str, port: int) -> str:
    if ":" in address and not address.startswith("["):
        return f"[{address}]:{port}"  # IPv6 literal
    return f"{address}:{port}"
