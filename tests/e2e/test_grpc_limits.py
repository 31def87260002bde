"""Attacks on the gRPC port's HTTP/2 transport against a server with small limits: each bound
holds, and an unrelated client is still served promptly during and after the attack."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
from tritonclient.grpc import service_pb2 as pb

from tests.e2e.observe import metric
from tests.e2e.test_grpc_raw import (
    SERVICE,
    Frame,
    RawClient,
    assert_still_serving,
    goaway_code,
    grpc_message,
    grpc_port,
    identity_request,
    infer_request,
    request_headers,
)
from tests.server_process import TritiumProcess
from tritium.frontends.grpc.http2 import (
    ACK,
    END_HEADERS,
    END_STREAM,
    FrameType,
    H2Error,
    Setting,
    frame,
    parse_settings,
    rst_stream,
    settings_payload,
    window_update,
)
from tritium.frontends.grpc.status import GrpcStatus

# Thread kind only: the gRPC transport's limits, enforced before any instance runs.
INSTANCE_KINDS = ("thread",)

MIB = 1 << 20
BUDGET = 8 * MIB
MAX_CONNECTIONS = 40
STREAM_REQUESTS = 4
LIMIT_FLAGS = (
    "--grpc-idle-timeout-secs", "2", "--grpc-preface-timeout-secs", "1",
    "--grpc-message-timeout-secs", "2", "--grpc-max-connections", str(MAX_CONNECTIONS),
    "--grpc-max-stream-requests", str(STREAM_REQUESTS), "--grpc-max-buffered-bytes", str(BUDGET),
)
PROMPT_S = 2.0  # an unrelated client's inference, even on a loaded machine
STREAM_INFER = f"{SERVICE}/ModelStreamInfer"
CLOSED = (ConnectionResetError, BrokenPipeError)


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[TritiumProcess]:
    process = TritiumProcess(repository, *LIMIT_FLAGS).start()
    yield process
    code = process.stop()
    assert code == 0, process.log()


@pytest.fixture(scope="module")
def roomy(repository: Path) -> Iterator[TritiumProcess]:
    """Default windows and budget, for the flow-control tests that spend whole windows."""
    process = TritiumProcess(repository).start()
    yield process
    code = process.stop()
    assert code == 0, process.log()


@pytest.fixture(scope="module")
def budgeted(repository: Path) -> Iterator[TritiumProcess]:
    """The byte budget alone: requests that never finish arriving are not timed out."""
    process = TritiumProcess(repository, "--grpc-max-buffered-bytes", str(BUDGET)).start()
    yield process
    code = process.stop()
    assert code == 0, process.log()


@contextlib.contextmanager
def connected(server: TritiumProcess) -> Iterator[RawClient]:
    raw = RawClient(grpc_port(server))
    try:
        yield raw
    finally:
        raw.close()


def headers(raw: RawClient, stream_id: int, path: str = SERVICE + "/ModelInfer",
            **extra: str) -> bytes:
    return frame(FrameType.HEADERS, END_HEADERS, stream_id, raw.block(request_headers(path,
                                                                                     **extra)))


def unary(raw: RawClient, stream_id: int, message: bytes, **extra: str) -> list[bytes]:
    return [headers(raw, stream_id, **extra), frame(FrameType.DATA, END_STREAM, stream_id, message)]


def bystander_seconds(server: TritiumProcess) -> float:
    """How long one identity inference on a fresh connection takes."""
    started = time.monotonic()
    with connected(server) as raw:
        raw.send(*unary(raw, 1, grpc_message(identity_request([1.0], "bystander"))))
        assert raw.reply(1).infer_response().id == "bystander"
    return time.monotonic() - started


def assert_bystander_served(server: TritiumProcess) -> None:
    elapsed = bystander_seconds(server)
    assert elapsed < PROMPT_S, f"an unrelated inference took {elapsed:.2f} s"


def assert_calmed(raw: RawClient, debug: str) -> None:
    goaway = raw.until(FrameType.GOAWAY)
    assert goaway_code(goaway) == H2Error.ENHANCE_YOUR_CALM, goaway.payload[8:]
    assert debug in goaway.payload[8:].decode()


def filler(stream_id: int, count: int) -> Iterator[bytes]:
    """``count`` bytes of DATA on ``stream_id`` as whole request messages of 1 MiB or less
    (whole, so none is timed out as a message that stopped arriving)."""
    while count:
        size = min(count, MIB)
        body = grpc_message(bytes(size - 5)) if size >= 5 else bytes(size)
        yield frame(FrameType.DATA, 0, stream_id, body)
        count -= size


class Credit:
    """What the server lets this client send, as its SETTINGS and WINDOW_UPDATEs say."""

    def __init__(self, raw: RawClient):
        self.raw = raw
        self.initial = self.connection = 65_535
        self.streams: dict[int, int] = {}
        self._acks_due = 1  # RawClient sent its SETTINGS

    def open(self, stream_id: int) -> None:
        self.raw.send(headers(self.raw, stream_id))
        self.streams[stream_id] = self.initial

    def fill(self, stream_id: int, count: int) -> None:
        for piece in filler(stream_id, count):
            self.raw.send(piece)
        self.streams[stream_id] -= count
        self.connection -= count

    def barrier(self) -> list[tuple[int, int]]:
        """The credit the server gave until it acknowledged one more SETTINGS: it reads
        frames in order, so by then it has decided on everything sent before."""
        self.raw.send(frame(FrameType.SETTINGS, 0, 0, b""))
        self._acks_due += 1
        updates = []
        while self._acks_due:
            found = self.raw.read()
            assert found is not None, "the server closed the connection"
            assert found.kind not in (FrameType.RST_STREAM, FrameType.GOAWAY), found
            if found.kind == FrameType.SETTINGS:
                self._settings(found)
            elif found.kind == FrameType.WINDOW_UPDATE:
                increment = int.from_bytes(found.payload, "big")
                updates.append((found.stream_id, increment))
                if found.stream_id:
                    self.streams[found.stream_id] += increment
                else:
                    self.connection += increment
        return updates

    def _settings(self, found: Frame) -> None:
        if found.flags & ACK:
            self._acks_due -= 1
            return
        window = parse_settings(found.payload).get(Setting.INITIAL_WINDOW_SIZE)
        if window is not None:
            self.initial = window


def spend_everything(credit: Credit, new_streams: Iterator[int]) -> None:
    """Send all the credit the server grants, opening streams from ``new_streams`` as their
    windows run out, until a round earns no more (a few rounds)."""
    for _ in range(5):
        while credit.connection:
            room = [s for s, left in credit.streams.items() if left > 0]
            if not room:
                stream_id = next(new_streams, None)
                if stream_id is None:
                    break
                credit.open(stream_id)
                continue
            credit.fill(room[0], min(credit.connection, credit.streams[room[0]]))
        if not credit.barrier():
            return
    raise AssertionError("the server kept granting credit")


# ===================================================================== decompression


def test_gzip_bomb_is_refused_quickly(server: TritiumProcess) -> None:
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(MIB)
    bomb = b"".join(packer.compress(zeros) for _ in range(64)) + packer.flush()
    assert len(bomb) < MIB  # 64 MiB inflated, 8 times the effective message limit
    with connected(server) as raw:
        started = time.monotonic()
        raw.send(*unary(raw, 1, grpc_message(bomb, compressed=True), grpc_encoding="gzip"))
        during = bystander_seconds(server)
        reply = raw.reply(1)
        elapsed = time.monotonic() - started
    assert reply.status in (GrpcStatus.RESOURCE_EXHAUSTED, GrpcStatus.INTERNAL), reply
    # Over the message limit, or (counted step by step) over what the budget has left.
    assert "larger than" in reply.message or "does not fit" in reply.message
    assert elapsed < 5.0
    assert during < PROMPT_S
    assert_still_serving(server)


# ===================================================================== flow control


def test_data_past_the_stream_window_resets_the_stream(roomy: TritiumProcess) -> None:
    server = roomy
    with connected(server) as raw:
        credit = Credit(raw)
        credit.barrier()
        # The connection's window starts small and grows as it is used.
        assert credit.initial == 16 * MIB and 64 * 1024 < credit.connection <= 16 * MIB
        credit.open(1)
        for _ in range(40):  # the connection's credit comes back; the stream's does not
            credit.fill(1, min(credit.connection, credit.streams[1]))
            credit.barrier()
            if not credit.streams[1]:
                break
        assert credit.streams[1] == 0 and credit.connection > 0
        raw.send(frame(FrameType.DATA, 0, 1, b"\x00"))
        reset = raw.until(FrameType.RST_STREAM, 1)
        assert int.from_bytes(reset.payload, "big") == H2Error.FLOW_CONTROL_ERROR
        assert_bystander_served(server)
        # A stream error: the connection goes on serving.
        raw.send(*unary(raw, 3, grpc_message(identity_request([2.0], "after-overrun"))))
        assert raw.reply(3).infer_response().id == "after-overrun"


def test_data_past_the_connection_window_ends_the_connection(server: TritiumProcess) -> None:
    # The budget bounds the connection's credit: spending it all is quick.
    with connected(server) as raw:
        credit = Credit(raw)
        credit.barrier()
        stream_ids = iter(range(1, 41, 2))
        spend_everything(credit, stream_ids)
        assert credit.connection == 0
        assert_bystander_served(server)
        stream_id = next(stream_ids)
        raw.send(headers(raw, stream_id), frame(FrameType.DATA, 0, stream_id, b"\x00"))
        goaway = raw.until(FrameType.GOAWAY)
        assert goaway_code(goaway) == H2Error.FLOW_CONTROL_ERROR
        assert raw.remaining() == []
    assert_still_serving(server)


def test_stream_requests_in_flight_are_bounded(server: TritiumProcess) -> None:
    count, seconds = 40, 0.05
    body = b"".join(grpc_message(infer_request("slow", np.array([seconds]), f"bound{i}"))
                    for i in range(count))
    pending: list[float] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            pending.append(metric(server.metrics_url, "nv_inference_pending_request_count",
                                  model="slow"))

    sampler = threading.Thread(target=sample)
    with connected(server) as raw:
        raw.send(headers(raw, 1, STREAM_INFER), *data_frames(1, body))
        sampler.start()
        try:
            reply = raw.reply(1)
        finally:
            done.set()
            sampler.join()
    assert reply.status == GrpcStatus.OK, reply.message
    answers = [pb.ModelStreamInferResponse.FromString(m) for m in reply.messages()]
    assert sorted(a.infer_response.id for a in answers) == sorted(f"bound{i}" for i in range(count))
    assert not any(a.error_message for a in answers)
    # One instance runs one request; the rest of the four in flight wait in its queue.
    assert max(pending) <= STREAM_REQUESTS, pending
    assert max(pending) >= 1, "the sampler never saw a queued request"
    assert_bystander_served(server)


def data_frames(stream_id: int, body: bytes) -> list[bytes]:
    """``body`` as DATA frames of 16 KiB, the last one ending the stream."""
    pieces = [body[i:i + 16384] for i in range(0, len(body), 16384)]
    return [frame(FrameType.DATA, END_STREAM if i == len(pieces) - 1 else 0, stream_id, piece)
            for i, piece in enumerate(pieces)]


# ===================================================================== held bytes


def test_stalled_half_message_ends_its_call(server: TritiumProcess) -> None:
    half = grpc_message(bytes(4 * MIB))[:2 * MIB]
    with connected(server) as raw:
        raw.send(headers(raw, 1), *(frame(FrameType.DATA, 0, 1, half[i:i + MIB])
                                    for i in range(0, len(half), MIB)))
        stopped_at = time.monotonic()
        assert_bystander_served(server)
        reply = raw.reply(1)
        waited = time.monotonic() - stopped_at
    assert reply.status == GrpcStatus.CANCELLED, reply
    assert "stopped arriving" in reply.message
    assert 1.0 < waited < 6.0
    assert_still_serving(server)


def test_byte_budget_bounds_the_credit_granted(budgeted: TritiumProcess) -> None:
    server = budgeted
    with connected(server) as holder:
        held = Credit(holder)
        held.barrier()
        # The server reserves a connection's credit in the budget before granting it.
        assert 64 * 1024 <= held.connection <= BUDGET
        held.open(1)
        for _ in range(20):  # bytes of a unary call it never half-closes, as it is granted
            held.fill(1, min(held.connection, held.streams[1]))
            held.barrier()
            if not held.connection:
                break
        assert held.connection == 0
        with connected(server) as greedy:
            credit = Credit(greedy)
            credit.barrier()
            # The budget is spent: only what HTTP/2 grants before the server speaks.
            assert credit.connection <= 65535
            credit.open(1)
            credit.fill(1, credit.connection)
            assert [update for update in credit.barrier() if update[0] == 0] == []
            assert credit.connection == 0
            assert_bystander_served(server)
    # What the holder had is released with its connection: a newcomer gets credit again
    # (once the server has seen the close, which may trail the next connect a little).
    deadline = time.monotonic() + 5.0
    while True:
        with connected(server) as after:
            credit = Credit(after)
            credit.barrier()
        if credit.connection > 65535 or time.monotonic() > deadline:
            break
    assert credit.connection > 65535
    with connected(server) as big:
        started = time.monotonic()
        big.send(headers(big, 1), frame(FrameType.DATA, 0, 1, b"\x00" + (
            BUDGET + 1).to_bytes(4, "big") + bytes(1000)))
        reply = big.reply(1)
        assert time.monotonic() - started < PROMPT_S
    assert reply.status == GrpcStatus.RESOURCE_EXHAUSTED, reply
    assert "larger than max" in reply.message
    assert_still_serving(server)


def test_budget_bounds_bytes_held_over_all_connections(budgeted: TritiumProcess) -> None:
    server = budgeted
    # Each peer sends every byte it is granted, as whole messages of unary calls it never
    # half-closes: the server holds them all, and --grpc-max-buffered-bytes says how many.
    before = rss_bytes(server.pid)
    with contextlib.ExitStack() as stack:
        for _ in range(4):
            credit = Credit(stack.enter_context(connected(server)))
            credit.barrier()
            spend_everything(credit, iter(range(1, 41, 2)))
        grown = rss_bytes(server.pid) - before
        assert_bystander_served(server)
    assert grown < 2 * BUDGET + 32 * MIB, f"the server holds {grown / MIB:.0f} MiB more"


# ===================================================================== floods


def test_settings_flood_is_calmed(server: TritiumProcess) -> None:
    with connected(server) as raw:
        raw.send(frame(FrameType.SETTINGS, 0, 0, b"") * 2000)
        assert_calmed(raw, "SETTINGS")
    assert_bystander_served(server)


def test_ping_flood_is_calmed(server: TritiumProcess) -> None:
    with connected(server) as raw:
        raw.send(*(frame(FrameType.PING, 0, 0, i.to_bytes(8, "big")) for i in range(10)))
        answered = []
        while (found := raw.read()) is not None and found.kind != FrameType.GOAWAY:
            if found.kind == FrameType.PING:
                answered.append(found.payload)
        assert found is not None and goaway_code(found) == H2Error.ENHANCE_YOUR_CALM
        assert b"too_many_pings" in found.payload[8:]
        assert 1 <= len(answered) <= 3  # the first ping and the two strikes allowed
    assert_bystander_served(server)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_flooder_that_never_reads_is_cut_off(server: TritiumProcess) -> None:
    before = rss_bytes(server.pid)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # its answers pile up on us
    sock.settimeout(3.0)
    sock.connect(("127.0.0.1", grpc_port(server)))
    batch = (frame(FrameType.SETTINGS, 0, 0, b"") + frame(FrameType.PING, 0, 0, b"flooding")) * 500
    outcome, answers = "sent everything", b""
    try:
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        # 33 MB in all: more than loopback's buffers absorb, a million frames to answer.
        for _ in range(3000):
            sock.sendall(batch)
    except CLOSED:
        outcome = "closed"
    except TimeoutError:
        outcome = "stalled"  # the server stopped reading
    with contextlib.suppress(*CLOSED):
        while chunk := sock.recv(65536):
            answers += chunk
    sock.close()
    assert outcome in ("closed", "stalled")
    assert len(answers) < 4096  # a few answers, then the GOAWAY
    *_, last = split(answers)
    assert goaway_code(last) == H2Error.ENHANCE_YOUR_CALM
    assert rss_bytes(server.pid) - before < 64 * MIB
    assert_bystander_served(server)


def split(data: bytes) -> list[Frame]:
    frames = []
    while data:
        length = int.from_bytes(data[:3], "big")
        frames.append(Frame(data[3], data[4], int.from_bytes(data[5:9], "big"),
                            data[9:9 + length]))
        data = data[9 + length:]
    return frames


def flood_in_background(raw: RawClient, chunks: list[bytes]) -> threading.Thread:
    def run() -> None:
        with contextlib.suppress(*CLOSED):
            for chunk in chunks:
                raw.send(chunk)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_rapid_reset_is_calmed(server: TritiumProcess) -> None:
    with connected(server) as raw:
        first = headers(raw, 1)
        again = raw.block(request_headers())  # the same fields: now table references only
        pairs = [first + rst_stream(1, H2Error.CANCEL)] + [
            frame(FrameType.HEADERS, END_HEADERS, s, again) + rst_stream(s, H2Error.CANCEL)
            for s in range(3, 10_000, 2)]
        assert len(pairs) == 5000
        flooder = flood_in_background(raw, [b"".join(pairs[i:i + 250])
                                            for i in range(0, len(pairs), 250)])
        during = bystander_seconds(server)
        flooder.join()
        assert_calmed(raw, "reset")
    assert during < PROMPT_S
    assert_bystander_served(server)


FLOODS: dict[str, tuple[Callable[[RawClient], list[bytes]], str]] = {
    "empty-data": (lambda r: [headers(r, 1)] + [frame(FrameType.DATA, 0, 1, b"")] * 1000,
                   "empty DATA"),
    "continuations": (lambda r: [frame(FrameType.HEADERS, 0, 1, r.block(request_headers()))]
                      + [frame(FrameType.CONTINUATION, 0, 1, b"")] * 100, "CONTINUATION"),
}


@pytest.mark.parametrize("case", list(FLOODS))
def test_frames_that_carry_nothing_are_calmed(server: TritiumProcess, case: str) -> None:
    build, debug = FLOODS[case]
    with connected(server) as raw:
        raw.send(*build(raw))
        assert_calmed(raw, debug)
    assert_bystander_served(server)


# ===================================================================== connections


def test_idle_connection_is_closed(server: TritiumProcess) -> None:
    with connected(server) as raw:
        opened = time.monotonic()
        # Gracefully: the first GOAWAY still takes every stream, and a PING follows it.
        first = raw.until(FrameType.GOAWAY)
        idle = time.monotonic() - opened
        assert goaway_code(first) == H2Error.NO_ERROR
        assert int.from_bytes(first.payload[:4], "big") == (1 << 31) - 1
        ping = raw.until(FrameType.PING)
        raw.send(frame(FrameType.PING, 0x1, 0, bytes(ping.payload)))  # as a client answers
        final = raw.until(FrameType.GOAWAY)
        assert goaway_code(final) == H2Error.NO_ERROR
        assert int.from_bytes(final.payload[:4], "big") == 0  # no stream was ever opened
        assert raw.remaining() == []
    assert 1.5 < idle < 6.0


def test_connection_without_a_preface_is_closed(server: TritiumProcess) -> None:
    with socket.create_connection(("127.0.0.1", grpc_port(server)), timeout=10) as sock:
        opened = time.monotonic()
        assert sock.recv(100) == b""
        waited = time.monotonic() - opened
    assert 0.5 < waited < 5.0


def accepted(server: TritiumProcess) -> RawClient | None:
    """A connection holding one open call (so it is not idle), or None if it was refused."""
    try:
        raw = RawClient(grpc_port(server))
    except CLOSED:
        return None
    try:
        raw.send(headers(raw, 1))
        found = raw.read()
    except CLOSED:
        found = None
    if found is None:
        raw.close()
        return None
    assert found.kind == FrameType.SETTINGS
    return raw


def accept_soon(server: TritiumProcess) -> RawClient:
    """A new connection once the server has seen others close (that takes it a moment)."""
    deadline = time.monotonic() + 10.0
    while (raw := accepted(server)) is None:
        assert time.monotonic() < deadline, "no connection accepted after others closed"
        time.sleep(0.02)
    return raw


def test_connection_cap(server: TritiumProcess) -> None:
    held: list[RawClient] = []
    try:
        while (raw := accepted(server)) is not None:
            held.append(raw)
            assert len(held) <= MAX_CONNECTIONS
        assert len(held) >= MAX_CONNECTIONS - 2  # a bystander's may still be closing
        started = time.monotonic()
        assert accepted(server) is None
        assert time.monotonic() - started < PROMPT_S
        live = requests.get(f"http://{server.http_url}/v2/health/live", timeout=PROMPT_S)
        assert live.status_code == 200
        for raw in held[:5]:
            raw.close()
        del held[:5]
        held.append(accept_soon(server))
        while len(held) < MAX_CONNECTIONS:
            held.append(accept_soon(server))
        assert accepted(server) is None
    finally:
        for raw in held:
            raw.close()
    accept_soon(server).close()
    assert_still_serving(server)


# ===================================================================== RFC 9113 errors


def _opened(r: RawClient, *frames: bytes) -> list[bytes]:
    return [headers(r, 1), *frames]


FRAME_ERRORS: dict[str, tuple[Callable[[RawClient], list[bytes]], H2Error]] = {
    "settings-ack-with-payload": (lambda r: [frame(FrameType.SETTINGS, ACK, 0, bytes(6))],
                                  H2Error.FRAME_SIZE_ERROR),
    "enable-push-2": (lambda r: [frame(FrameType.SETTINGS, 0, 0, settings_payload(
        {Setting.ENABLE_PUSH: 2}))], H2Error.PROTOCOL_ERROR),
    "stream-id-backwards": (lambda r: [headers(r, 5), headers(r, 3)], H2Error.PROTOCOL_ERROR),
    "rst-stream-0": (lambda r: [rst_stream(0, H2Error.CANCEL)], H2Error.PROTOCOL_ERROR),
    "rst-idle-stream": (lambda r: _opened(r, rst_stream(7, H2Error.CANCEL)),
                        H2Error.PROTOCOL_ERROR),
    "rst-3-bytes": (lambda r: _opened(r, frame(FrameType.RST_STREAM, 0, 1, b"\x00\x00\x08")),
                    H2Error.FRAME_SIZE_ERROR),
    "priority-4-bytes": (lambda r: _opened(r, frame(FrameType.PRIORITY, 0, 1, bytes(4))),
                         H2Error.FRAME_SIZE_ERROR),
    "goaway-4-bytes": (lambda r: [frame(FrameType.GOAWAY, 0, 0, bytes(4))],
                       H2Error.FRAME_SIZE_ERROR),
    "window-update-idle-stream": (lambda r: _opened(r, window_update(9, 100)),
                                  H2Error.PROTOCOL_ERROR),
}


@pytest.mark.parametrize("case", list(FRAME_ERRORS))
def test_frame_error_ends_the_connection(server: TritiumProcess, case: str) -> None:
    build, code = FRAME_ERRORS[case]
    with connected(server) as raw:
        raw.send(*build(raw))
        goaway = raw.until(FrameType.GOAWAY)
        assert goaway_code(goaway) == code, goaway.payload[8:]
        assert raw.remaining() == []
    assert_bystander_served(server)
    assert_still_serving(server)
