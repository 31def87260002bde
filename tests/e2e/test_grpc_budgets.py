"""The gRPC byte budget against one greedy client: inflated bytes count in it (a gzip bomb
holds no more than its sender's share), and each peer address holds at most its share, so
one peer cannot starve the others."""

from __future__ import annotations

import contextlib
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb

from tests.e2e.bystander import Bystander, health_url, peak_rss_bytes
from tests.e2e.test_grpc_limits import Credit, headers
from tests.e2e.test_grpc_raw import RawClient, grpc_message, grpc_port
from tests.server_process import TritiumProcess
from tritium.frontends.grpc.http2 import END_STREAM, FrameType, frame
from tritium.frontends.grpc.protowire import encode_varint
from tritium.frontends.grpc.status import GrpcStatus

INSTANCE_KINDS = ("thread",)

MIB = 1 << 20
SHARE = 32 * MIB
BOMB = 24 * MIB  # inflated: under the message limit, so only the budget can refuse it
BOMBS = 6


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[TritiumProcess]:
    process = TritiumProcess(repository, "--grpc-max-peer-buffered-bytes", str(SHARE),
                             "--grpc-max-buffered-bytes", str(3 * SHARE)).start()
    yield process
    assert process.stop() == 0, process.log()


def gzip_bomb(inflated: int) -> bytes:
    """A ModelInferRequest whose raw input is ``inflated`` zero bytes, gzipped (a few
    tens of KiB), built without ever holding it inflated."""
    head = pb.ModelInferRequest(model_name="no_such_model", inputs=[
        pb.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="UINT8",
                                              shape=[inflated])]).SerializeToString()
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    parts = [packer.compress(head + b"\x3a" + encode_varint(inflated))]
    zeros = bytes(4 * MIB)
    parts += [packer.compress(zeros) for _ in range(inflated // len(zeros))]
    return b"".join([*parts, packer.flush()])


def send_frames(raw: RawClient, stream_id: int, message: bytes) -> None:
    pieces = [message[i:i + 16_384] for i in range(0, len(message), 16_384)]
    raw.send(headers(raw, stream_id, grpc_encoding="gzip"),
             *(frame(FrameType.DATA, END_STREAM if i == len(pieces) - 1 else 0, stream_id,
                     piece) for i, piece in enumerate(pieces)))


def test_inflated_bytes_count_in_the_senders_share(server: TritiumProcess) -> None:
    """Six bombs at once on one connection, each inflating to 24 MiB (144 MiB together)
    from a peer whose share is 32 MiB: the server never holds much more than the share of
    them (the ones that do not fit end RESOURCE_EXHAUSTED), and others are served."""
    bomb = grpc_message(gzip_bomb(BOMB), compressed=True)
    assert len(bomb) < 64 * 1024
    before = peak_rss_bytes(server.pid)
    bystander = Bystander(health_url(server.http_url))
    streams = [1 + 2 * i for i in range(BOMBS)]
    with bystander.watching() as latencies, contextlib.closing(
            RawClient(grpc_port(server))) as raw:
        for stream_id in streams:
            send_frames(raw, stream_id, bomb)
        replies = raw.replies(streams)
    bystander.close()
    statuses = [reply.status for reply in replies.values()]
    exhausted = [r for r in replies.values() if r.status == GrpcStatus.RESOURCE_EXHAUSTED]
    assert exhausted and "does not fit" in exhausted[0].message, statuses
    # The ones that fit were parsed whole and then refused for their unknown model.
    assert all(r.status == GrpcStatus.RESOURCE_EXHAUSTED or "no_such_model" in r.message
               for r in replies.values()), [(r.status, r.message) for r in replies.values()]
    grown = peak_rss_bytes(server.pid) - before
    assert grown < 3 * SHARE, f"peak memory grew {grown / MIB:.0f} MiB"
    bystander.assert_served(latencies)


def spend_all(credit: Credit) -> None:
    """Send every byte of credit the server grants, on unary calls never finished (the
    server holds them), until it grants no more."""
    credit.barrier()
    new_streams = iter(range(1, 401, 2))
    for _ in range(40):
        while credit.connection:
            room = [s for s, left in credit.streams.items() if left > 0]
            if not room:
                credit.open(next(new_streams))
                continue
            credit.fill(room[0], min(credit.connection, credit.streams[room[0]]))
        if not credit.barrier():
            return
    raise AssertionError("the server kept granting credit")


def test_one_peer_cannot_take_the_others_share(server: TritiumProcess) -> None:
    """A peer (127.0.0.2) spends all the credit its connections get on unary calls it never
    finishes: it gets its share and no more, and another peer's 24 MiB request is served
    at once instead of waiting for credit the greedy one holds."""
    with contextlib.ExitStack() as stack:
        for _ in range(4):
            greedy = stack.enter_context(contextlib.closing(
                RawClient(grpc_port(server), source="127.0.0.2")))
            spend_all(Credit(greedy))
        latecomer = stack.enter_context(contextlib.closing(
            RawClient(grpc_port(server), source="127.0.0.2")))
        credit = Credit(latecomer)
        credit.barrier()
        assert credit.connection <= 65_535  # the peer's share is spent
        started = time.monotonic()
        values = np.arange(BOMB // 4, dtype=np.float32)
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            tensor = grpcclient.InferInput("INPUT0", [len(values)], "FP32")
            tensor.set_data_from_numpy(values)
            result = client.infer("identity_fp32", [tensor])
        assert np.array_equal(result.as_numpy("OUTPUT0"), values)
        assert time.monotonic() - started < 30
