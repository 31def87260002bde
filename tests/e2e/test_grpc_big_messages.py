"""A big gRPC request within one peer's byte share (the default 2 GiB), inflated from a bomb:
it is inflated, joined and parsed without holding the event loop, and its raw input is never
copied (upb would copy it while holding the GIL), so an unrelated client is served within
100 ms meanwhile and the server holds the message once."""

from __future__ import annotations

import contextlib
import time

from tests.e2e.bystander import Bystander, health_url, peak_rss_bytes
from tests.e2e.test_grpc_budgets import gzip_bomb, send_frames
from tests.e2e.test_grpc_raw import RawClient, grpc_message, grpc_port
from tests.server_process import TritiumProcess
from tritium.frontends.grpc.status import GrpcStatus

INSTANCE_KINDS = ("thread",)

MIB = 1 << 20
INFLATED = 512 * MIB  # copied whole with the GIL held, it stalled every client ~0.3 s


def test_a_big_inflated_message_never_holds_the_loop(server: TritiumProcess) -> None:
    bomb = grpc_message(gzip_bomb(INFLATED), compressed=True)
    assert len(bomb) < MIB
    before = peak_rss_bytes(server.pid)
    bystander = Bystander(health_url(server.http_url))
    with bystander.watching() as latencies, contextlib.closing(
            RawClient(grpc_port(server))) as raw:
        started = time.monotonic()
        send_frames(raw, 1, bomb)
        reply = raw.replies([1])[1]
        elapsed = time.monotonic() - started
    bystander.close()
    # Parsed whole, then refused for its model (looked up once the message is read).
    assert reply.status == GrpcStatus.INVALID_ARGUMENT, (reply.status, reply.message)
    assert "no_such_model" in reply.message
    grown = peak_rss_bytes(server.pid) - before
    assert grown < 1.25 * INFLATED, f"peak memory grew {grown / MIB:.0f} MiB"
    assert elapsed < 30
    bystander.assert_served(latencies)
