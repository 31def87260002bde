"""A big gRPC request within one peer's byte share (the default 2 GiB), sent whole or inflated
from a bomb: it is received, inflated, joined and parsed without holding the event loop, and
its raw input is never copied (upb would copy it while holding the GIL), so an unrelated
client is served within 100 ms meanwhile and the server holds the message about once."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time

from tests.e2e.bystander import Bystander, health_url, peak_rss_bytes
from tests.e2e.test_grpc_budgets import gzip_bomb, send_frames
from tests.e2e.test_grpc_raw import INFER, RawClient, grpc_message, grpc_port
from tests.server_process import TritiumProcess
from tritium.frontends.grpc.status import GrpcStatus

INSTANCE_KINDS = ("thread",)

MIB = 1 << 20
INFLATED = 512 * MIB  # copied by upb with the GIL held, it stalled every client 0.9 s
PLAIN = 256 * MIB


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


# Sent from a process of its own: grpcio copies a message into its own buffer holding this
# process's GIL, which would stall the bystander's thread here, not the server.
_SEND_PLAIN = """
import sys, grpc
from tritonclient.grpc import service_pb2 as pb
from tritium.frontends.grpc.protowire import encode_varint
url, size, method = sys.argv[1], int(sys.argv[2]), sys.argv[3]
head = pb.ModelInferRequest(model_name="no_such_model", inputs=[
    pb.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="UINT8", shape=[size])])
payload = head.SerializeToString() + b"\\x3a" + encode_varint(size) + bytes(size)
with grpc.insecure_channel(url, options=[("grpc.max_send_message_length", -1)]) as channel:
    try:
        channel.unary_unary(method)(payload, timeout=60)
    except grpc.RpcError as exc:
        print(exc.code().name, exc.details())
"""


def test_a_big_plain_message_never_holds_the_loop(server: TritiumProcess) -> None:
    before = peak_rss_bytes(server.pid)
    bystander = Bystander(health_url(server.http_url))
    with bystander.watching() as latencies:
        started = time.monotonic()
        sent = subprocess.run([sys.executable, "-c", _SEND_PLAIN, server.grpc_url, str(PLAIN),
                               INFER], capture_output=True, text=True, timeout=120)
        elapsed = time.monotonic() - started
    bystander.close()
    assert sent.stdout.startswith("INVALID_ARGUMENT"), (sent.stdout, sent.stderr)
    assert "no_such_model" in sent.stdout
    grown = peak_rss_bytes(server.pid) - before
    # Received in one buffer (grown in place) and parsed from it.
    assert grown < 1.25 * PLAIN, f"peak memory grew {grown / MIB:.0f} MiB"
    assert elapsed < 60
    bystander.assert_served(latencies)
