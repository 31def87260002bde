"""A gRPC server that is leaving (SIGTERM: the lame duck, then the drain) loses no call that
a proxy in front of it has already sent: its GOAWAY comes in two steps, so a stream that
crosses the first one is still served; a connection opened during the lame duck is asked to
leave after its first call; once the drain begins, new connections are refused (which a
proxy retries elsewhere) while HTTP still answers."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from tritonclient.grpc import service_pb2 as pb

from tests.e2e.proxies import build_replica_repository
from tests.e2e.test_grpc_limits import unary
from tests.e2e.test_grpc_raw import SERVICE, Frame, RawClient, grpc_message, grpc_port
from tests.server_process import TritiumProcess
from tritium.frontends.grpc.http2 import FrameType, H2Error, frame

pytestmark = pytest.mark.e2e

LAME_DUCK_S = 4
ALL_STREAMS = (1 << 31) - 1
ACK = 0x1
LIVE = grpc_message(pb.ServerLiveRequest().SerializeToString())


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[TritiumProcess]:
    repo = build_replica_repository(tmp_path / "repo", tmp_path)
    server = TritiumProcess(repo, "--lame-duck-secs", str(LAME_DUCK_S)).start()
    yield server
    server.stop()


def live(raw: RawClient, stream_id: int) -> list[bytes]:
    return unary(raw, stream_id, LIVE, path=f"{SERVICE}/ServerLive")


def goaway_of(found: Frame) -> tuple[int, int]:
    """(last stream id, error code) of a GOAWAY frame."""
    return (int.from_bytes(found.payload[:4], "big"),
            int.from_bytes(found.payload[4:8], "big"))


def answered(raw: RawClient, stream_id: int) -> str | None:
    """The grpc-status of the stream's answer."""
    return raw.reply(stream_id).trailers.get("grpc-status")


def test_a_call_crossing_the_first_goaway_is_served(server: TritiumProcess) -> None:
    raw = RawClient(grpc_port(server))
    try:
        raw.send(*live(raw, 1))
        assert answered(raw, 1) == "0"
        server.signal(signal.SIGTERM)
        first = raw.until(FrameType.GOAWAY)
        assert goaway_of(first) == (ALL_STREAMS, H2Error.NO_ERROR)
        ping = raw.until(FrameType.PING)
        # A proxy that had not read the GOAWAY yet opens one more stream: it is served.
        raw.send(*live(raw, 3))
        assert answered(raw, 3) == "0"
        raw.send(frame(FrameType.PING, ACK, 0, ping.payload))
        final = raw.until(FrameType.GOAWAY)
        assert goaway_of(final) == (3, H2Error.NO_ERROR)  # streams after 3 are not served
        assert raw.remaining() == []  # and closed: no call is left on it
    finally:
        raw.close()


def test_a_connection_opened_in_the_lame_duck_leaves_after_its_first_call(
        server: TritiumProcess) -> None:
    server.signal(signal.SIGTERM)
    server.wait_for_line("lame duck: reporting not ready", timeout=30)
    raw = RawClient(grpc_port(server))
    try:
        raw.send(*live(raw, 1))
        # Asked to leave once the call has begun (the GOAWAY comes before its answer) ...
        assert goaway_of(raw.until(FrameType.GOAWAY)) == (ALL_STREAMS, H2Error.NO_ERROR)
        ping = raw.until(FrameType.PING)
        assert answered(raw, 1) == "0"  # ... and served, as everything in the lame duck is
        raw.send(frame(FrameType.PING, ACK, 0, ping.payload))
        assert goaway_of(raw.until(FrameType.GOAWAY)) == (1, H2Error.NO_ERROR)
        assert raw.remaining() == []  # and closed: no call is left on it
    finally:
        raw.close()


def test_the_drain_refuses_new_grpc_connections_and_answers_http(
        server: TritiumProcess) -> None:
    # A request that outlives the lame duck keeps the drain going while we look.
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1],
                        "data": [LAME_DUCK_S + 3.0]}]}
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(requests.post, f"http://{server.http_url}/v2/models/slow/infer",
                           json=body, timeout=120)
        server.signal(signal.SIGTERM)
        server.wait_for_line("shutting down: waiting up to", timeout=LAME_DUCK_S + 30)
        with pytest.raises(ConnectionRefusedError):
            RawClient(grpc_port(server))
        late = requests.post(f"http://{server.http_url}/v2/models/slow/infer",
                             json=body, timeout=30)
        assert late.status_code == 503 and "shutting down" in late.text, late.text
        assert held.result().status_code == 200  # drained
