"""The gRPC port's own HTTP/2 transport driven frame by frame: a scripted h2 client for what
a well-behaved peer does, raw frames for what h2 refuses to send."""

from __future__ import annotations

import gzip
import socket
import time
import uuid
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

import h2.config
import h2.connection
import h2.events
import h2.settings
import hpack
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from h2.errors import ErrorCodes
from tritonclient.grpc import service_pb2 as pb

from tests.e2e.observe import Records, metric, wait_for_metric
from tests.server_process import TritiumProcess
from tritium.frontends.grpc.http2 import (
    END_HEADERS,
    END_STREAM,
    PADDED,
    PREFACE,
    PRIORITY,
    FrameType,
    H2Error,
    Setting,
    frame,
    references_only,
    settings_payload,
    window_update,
)
from tritium.frontends.grpc.status import GrpcStatus

# Thread kind only: raw HTTP/2 frames against the gRPC transport, which never reaches an
# instance.
INSTANCE_KINDS = ("thread",)

SERVICE = "/inference.GRPCInferenceService"
INFER = f"{SERVICE}/ModelInfer"
TIMEOUT_S = 30.0  # any single wait for the server; generous for a busy CI machine
STOP_BOUND_S = 1.0  # how long a model may keep working after its call ended
CANCELLED = "tritium_inference_cancellation"
MAX_DATA_FRAME = 16384


# -- messages --------------------------------------------------------------------------------


def grpc_port(server: TritiumProcess) -> int:
    return int(server.grpc_url.rsplit(":", 1)[1])


def new_id() -> str:
    return "raw" + uuid.uuid4().hex[:12]


def infer_request(model: str, values: np.ndarray, request_id: str = "") -> bytes:
    tensor = pb.ModelInferRequest.InferInputTensor(
        name="INPUT0", datatype="FP32", shape=list(values.shape))
    return pb.ModelInferRequest(model_name=model, id=request_id, inputs=[tensor],
                                raw_input_contents=[values.astype(np.float32).tobytes()],
                                ).SerializeToString()


def identity_request(values: list[float], request_id: str = "") -> bytes:
    return infer_request("identity_fp32", np.array(values, dtype=np.float32), request_id)


def slow_request(seconds: float, request_id: str) -> bytes:
    return infer_request("slow", np.array([seconds], dtype=np.float32), request_id)


def grpc_message(body: bytes, compressed: bool = False) -> bytes:
    return bytes((int(compressed),)) + len(body).to_bytes(4, "big") + body


def request_headers(path: str = INFER, **extra: str) -> list[tuple[bytes, bytes]]:
    headers = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", path.encode()),
               (b":authority", b"127.0.0.1"), (b"content-type", b"application/grpc"),
               (b"te", b"trailers")]
    replaced = {name.replace("_", "-").encode(): value.encode() for name, value in extra.items()}
    headers = [(name, replaced.pop(name, value)) for name, value in headers]
    return headers + list(replaced.items())


@dataclass
class Reply:
    """One stream's response as the client saw it."""

    headers: dict[str, str] = field(default_factory=dict)
    trailers: dict[str, str] = field(default_factory=dict)
    data: bytearray = field(default_factory=bytearray)
    frames: list[int] = field(default_factory=list)  # each DATA frame's length
    reset: int | None = None  # RST_STREAM's error code, if the stream was reset

    @property
    def status(self) -> int | None:
        """grpc-status, from the trailers or a trailers-only response's headers."""
        value = self.trailers.get("grpc-status", self.headers.get("grpc-status"))
        return None if value is None else int(value)

    @property
    def message(self) -> str:
        return unquote(self.trailers.get("grpc-message", self.headers.get("grpc-message", "")))

    def messages(self) -> list[bytes]:
        found, data = [], bytes(self.data)
        while data:
            assert len(data) >= 5 and data[0] == 0, f"bad message prefix {data[:5]!r}"
            size = int.from_bytes(data[1:5], "big")
            assert len(data) >= 5 + size, "truncated response message"
            found.append(data[5:5 + size])
            data = data[5 + size:]
        return found

    def infer_response(self) -> pb.ModelInferResponse:
        assert self.status == 0, (self.status, self.message)
        [body] = self.messages()
        return pb.ModelInferResponse.FromString(body)


def decoded(fields: Iterable[tuple[bytes | str, bytes | str]]) -> dict[str, str]:
    def text(value: bytes | str) -> str:
        return value.decode() if isinstance(value, bytes) else value

    return {text(name): text(value) for name, value in fields}


def first_output(response: pb.ModelInferResponse) -> np.ndarray:
    assert [o.name for o in response.outputs] == ["OUTPUT0"]
    return np.frombuffer(response.raw_output_contents[0], dtype=np.float32)


# -- a scripted h2 client --------------------------------------------------------------------


class H2Client:
    """A blocking HTTP/2 client over one socket; every wait is bounded by TIMEOUT_S."""

    def __init__(self, port: int, initial_window: int | None = None):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
        self.conn = h2.connection.H2Connection(
            config=h2.config.H2Configuration(client_side=True, header_encoding=None))
        if initial_window is not None:
            # Effective from the first byte: h2 then holds the server to it (FlowControlError).
            self.conn.local_settings = h2.settings.Settings(
                client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE:
                                             initial_window})
        self.conn.initiate_connection()
        self.flush()
        self.replies: dict[int, Reply] = {}
        self.ended: set[int] = set()
        self.other: list[h2.events.Event] = []  # events that belong to no stream

    def flush(self) -> None:
        if data := self.conn.data_to_send():
            self.sock.sendall(data)

    def close(self) -> None:
        self.sock.close()

    def start(self, headers: list[tuple[bytes, bytes]] | None = None,
              end_stream: bool = False) -> int:
        stream_id = self.conn.get_next_available_stream_id()
        self.conn.send_headers(stream_id, headers or request_headers(), end_stream=end_stream)
        self.flush()
        self.replies[stream_id] = Reply()
        return stream_id

    def send(self, stream_id: int, data: bytes, end_stream: bool = True) -> None:
        """Send ``data`` as the server's windows allow, reading its updates when they don't."""
        view = memoryview(data)
        while True:
            room = min(self.conn.local_flow_control_window(stream_id),
                       self.conn.max_outbound_frame_size, len(view))
            if room or not view:
                last = len(view) == room
                self.conn.send_data(stream_id, bytes(view[:room]), end_stream=end_stream and last)
                self.flush()
                view = view[room:]
                if last:
                    return
            else:
                self.receive()

    def receive(self, acknowledge: bool = True) -> list[h2.events.Event]:
        """One read's worth of events, dispatched onto ``replies``."""
        data = self.sock.recv(1 << 20)
        assert data, "the server closed the connection"
        events = self.conn.receive_data(data)
        for event in events:
            self._dispatch(event, acknowledge)
        self.flush()
        return events

    def _dispatch(self, event: h2.events.Event, acknowledge: bool) -> None:
        stream_id: int = getattr(event, "stream_id", None) or 0
        reply = self.replies.get(stream_id)
        if reply is None:
            assert not isinstance(event, h2.events.ConnectionTerminated), event
            self.other.append(event)
        elif isinstance(event, h2.events.ResponseReceived):
            reply.headers = decoded(event.headers or [])
        elif isinstance(event, h2.events.TrailersReceived):
            reply.trailers = decoded(event.headers or [])
        elif isinstance(event, h2.events.DataReceived):
            reply.data += event.data or b""
            reply.frames.append(len(event.data or b""))
            if acknowledge and event.flow_controlled_length:
                self.conn.acknowledge_received_data(event.flow_controlled_length, stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            self.ended.add(stream_id)
        elif isinstance(event, h2.events.StreamReset):
            reply.reset = event.error_code
            self.ended.add(stream_id)

    def wait(self, *stream_ids: int) -> list[Reply]:
        while not self.ended.issuperset(stream_ids):
            self.receive()
        return [self.replies[s] for s in stream_ids]

    def unary(self, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> Reply:
        stream_id = self.start(headers)
        self.send(stream_id, body)
        [reply] = self.wait(stream_id)
        return reply


@pytest.fixture
def client(server: TritiumProcess) -> Iterator[H2Client]:
    c = H2Client(grpc_port(server))
    yield c
    c.close()


@pytest.fixture(scope="module")
def slow(record_dir: Path) -> Records:
    return Records(record_dir / "slow.jsonl")


def cancellations(server: TritiumProcess, reason: str) -> float:
    return metric(server.metrics_url, CANCELLED, model="slow", reason=reason, stage="executing")


def assert_stopped_soon(records: Records, request_id: str, left_at: float) -> None:
    stopped = records.wait_for(request_id, "cancelled", timeout=TIMEOUT_S)
    assert stopped - left_at < STOP_BOUND_S, f"model stopped {stopped - left_at:.3f} s late"
    assert not records.times(request_id, "done")


def assert_still_serving(server: TritiumProcess) -> None:
    """A real gRPC client still gets answers (the zoo's broken models keep the server from
    being "ready", so liveness and an inference stand for it)."""
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        assert c.is_server_live()
        tensor = grpcclient.InferInput("INPUT0", [2], "FP32")
        tensor.set_data_from_numpy(np.array([5.0, 6.0], dtype=np.float32))
        result = c.infer("identity_fp32", [tensor])
        assert result.as_numpy("OUTPUT0").tolist() == [5.0, 6.0]


# -- raw frames ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    kind: int
    flags: int
    stream_id: int
    payload: bytes


class RawClient:
    """Writes frames as given (valid or not) and reads the server's frame by frame."""

    def __init__(self, port: int, settings: dict[Setting, int] | None = None,
                 source: str | None = None):
        # ``source``: another loopback address (127.0.0.2, ...), to be another peer.
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S,
                                             source_address=(source, 0) if source else None)
        self.buf = bytearray()
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.send(PREFACE, frame(FrameType.SETTINGS, 0, 0, settings_payload(settings or {})))

    def close(self) -> None:
        self.sock.close()

    def send(self, *frames: bytes) -> None:
        self.sock.sendall(b"".join(frames))

    def block(self, headers: list[tuple[bytes, bytes]]) -> bytes:
        return self.encoder.encode(headers)

    def read(self) -> Frame | None:
        """The server's next frame; None once it closed the connection."""
        while len(self.buf) < 9 or len(self.buf) < 9 + int.from_bytes(self.buf[:3], "big"):
            try:
                chunk = self.sock.recv(1 << 20)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                assert not self.buf, f"connection closed inside a frame: {bytes(self.buf)!r}"
                return None
            self.buf += chunk
        length = int.from_bytes(self.buf[:3], "big")
        found = Frame(self.buf[3], self.buf[4], int.from_bytes(self.buf[5:9], "big"),
                      bytes(self.buf[9:9 + length]))
        del self.buf[:9 + length]
        return found

    def until(self, kind: FrameType, stream_id: int | None = None) -> Frame:
        while (found := self.read()) is not None:
            if found.kind == kind and stream_id in (None, found.stream_id):
                return found
        raise AssertionError(f"connection closed before a {kind.name} frame")

    def remaining(self) -> list[Frame]:
        """Every frame until the server closes the connection."""
        frames = []
        while (found := self.read()) is not None:
            frames.append(found)
        return frames

    def reply(self, stream_id: int) -> Reply:
        return self.replies([stream_id])[stream_id]

    def replies(self, stream_ids: list[int]) -> dict[int, Reply]:
        """The responses of several streams answered in any order (every header block is
        decoded, so HPACK's table stays in step)."""
        found_replies = {stream_id: Reply() for stream_id in stream_ids}
        open_ids = set(stream_ids)
        while open_ids and (found := self.read()) is not None:
            fields = (decoded(self.decoder.decode(found.payload, raw=True))
                      if found.kind == FrameType.HEADERS else {})
            reply = found_replies.get(found.stream_id)
            if reply is None:
                continue
            if found.kind == FrameType.HEADERS:
                if reply.headers:
                    reply.trailers = fields
                else:
                    reply.headers = fields
            elif found.kind == FrameType.DATA:
                reply.data += found.payload
                reply.frames.append(len(found.payload))
            elif found.kind == FrameType.RST_STREAM:
                reply.reset = int.from_bytes(found.payload, "big")
                open_ids.discard(found.stream_id)
            if found.flags & END_STREAM and found.kind in (FrameType.HEADERS, FrameType.DATA):
                open_ids.discard(found.stream_id)
        assert not open_ids, f"connection closed before streams {sorted(open_ids)} ended"
        return found_replies


@pytest.fixture
def raw(server: TritiumProcess) -> Iterator[RawClient]:
    c = RawClient(grpc_port(server))
    yield c
    c.close()


def goaway_code(frame_: Frame) -> int:
    assert frame_.kind == FrameType.GOAWAY and frame_.stream_id == 0
    return int.from_bytes(frame_.payload[4:8], "big")


# ===================================================================== well-formed calls


def test_unary_infer(server: TritiumProcess, client: H2Client) -> None:
    reply = client.unary(grpc_message(identity_request([1.5, -2.0, 3.25], "one")))
    assert reply.headers[":status"] == "200"
    assert reply.headers["content-type"].startswith("application/grpc")
    assert reply.trailers == {"grpc-status": "0"}
    response = reply.infer_response()
    assert response.model_name == "identity_fp32" and response.id == "one"
    assert first_output(response).tolist() == [1.5, -2.0, 3.25]


def test_calls_on_one_connection_are_independent(client: H2Client) -> None:
    for index in range(3):
        reply = client.unary(grpc_message(identity_request([float(index)], f"seq{index}")))
        assert reply.infer_response().id == f"seq{index}"


def test_interleaved_calls_on_one_connection(client: H2Client) -> None:
    first = client.start()
    second = client.start()
    # Both header blocks are out before any message; the second call's message goes first.
    client.send(second, grpc_message(identity_request([2.0, 2.0], "second")))
    client.send(first, grpc_message(identity_request([1.0], "first")))
    one, two = client.wait(first, second)
    assert one.infer_response().id == "first"
    assert first_output(one.infer_response()).tolist() == [1.0]
    assert two.infer_response().id == "second"
    assert first_output(two.infer_response()).tolist() == [2.0, 2.0]


def test_message_split_over_many_data_frames(client: H2Client) -> None:
    message = grpc_message(identity_request([7.0] * 100, "split"))
    stream_id = client.start()
    # The prefix itself is cut in two, then the body goes in odd-sized pieces.
    for start, end in [(0, 2), (2, 5), (5, 6), (6, 200), (200, len(message))]:
        client.send(stream_id, message[start:end], end_stream=False)
    client.send(stream_id, b"", end_stream=True)
    [reply] = client.wait(stream_id)
    assert first_output(reply.infer_response()).tolist() == [7.0] * 100


def test_client_trailers_end_the_request(client: H2Client) -> None:
    stream_id = client.start()
    client.send(stream_id, grpc_message(identity_request([4.0], "trailers")), end_stream=False)
    client.conn.send_headers(stream_id, [(b"x-client-trailer", b"1")], end_stream=True)
    client.flush()
    [reply] = client.wait(stream_id)
    assert reply.infer_response().id == "trailers"


def test_grpc_proto_content_type_is_accepted(client: H2Client) -> None:
    headers = request_headers(content_type="application/grpc+proto")
    reply = client.unary(grpc_message(identity_request([1.0])), headers)
    assert reply.status == 0


def test_request_larger_than_the_stream_window(client: H2Client) -> None:
    # 20 MiB: more than the 16 MiB the server grants a stream, so it must send WINDOW_UPDATEs.
    values = np.arange(5 * 2**20, dtype=np.float32)
    reply = client.unary(grpc_message(infer_request("identity_fp32", values, "big")))
    assert np.array_equal(first_output(reply.infer_response()), values)
    assert max(reply.frames) <= MAX_DATA_FRAME


def test_server_settings(client: H2Client) -> None:
    while not any(isinstance(e, h2.events.RemoteSettingsChanged) for e in client.other):
        client.receive()
    [changed] = [e for e in client.other if isinstance(e, h2.events.RemoteSettingsChanged)]
    settings = {int(k): v.new_value for k, v in changed.changed_settings.items()}
    assert settings[Setting.MAX_CONCURRENT_STREAMS] == 4096
    assert settings[Setting.INITIAL_WINDOW_SIZE] == 16 * 2**20
    assert settings[Setting.MAX_FRAME_SIZE] == 2**20
    assert settings[Setting.ENABLE_PUSH] == 0


def test_ping_is_answered_with_the_same_bytes(client: H2Client) -> None:
    client.conn.ping(b"tritium!")
    client.flush()
    while not any(isinstance(e, h2.events.PingAckReceived) for e in client.other):
        client.receive()
    [ack] = [e for e in client.other if isinstance(e, h2.events.PingAckReceived)]
    assert ack.ping_data == b"tritium!"


def test_ping_ack_from_the_client_is_not_answered(raw: RawClient) -> None:
    raw.send(frame(FrameType.PING, 1, 0, b"ackackac"), frame(FrameType.PING, 0, 0, b"question"))
    ping = raw.until(FrameType.PING)
    assert (ping.flags, ping.payload) == (1, b"question")


# ------------------------------------------------------------- raw frames a client may send


def test_continuation_frames_and_padding(server: TritiumProcess, raw: RawClient) -> None:
    block = raw.block(request_headers())
    assert len(block) > 20
    cut1, cut2 = len(block) // 3, 2 * len(block) // 3
    # HEADERS: padded, with priority fields, and without END_HEADERS.
    headers = bytes([4]) + (0).to_bytes(4, "big") + b"\x10" + block[:cut1] + b"\x00" * 4
    message = grpc_message(identity_request([3.0, 1.0], "continued"))
    raw.send(frame(FrameType.HEADERS, PADDED | PRIORITY, 1, headers),
             frame(FrameType.CONTINUATION, 0, 1, block[cut1:cut2]),
             frame(FrameType.CONTINUATION, END_HEADERS, 1, block[cut2:]),
             # the message in two padded DATA frames, then an empty END_STREAM one
             frame(FrameType.DATA, PADDED, 1, bytes([7]) + message[:10] + b"\x00" * 7),
             frame(FrameType.DATA, PADDED, 1, bytes([0]) + message[10:]),
             frame(FrameType.DATA, PADDED | END_STREAM, 1, bytes([3]) + b"\x00" * 3))
    reply = raw.reply(1)
    response = reply.infer_response()
    assert response.id == "continued"
    assert first_output(response).tolist() == [3.0, 1.0]


def test_bytes_dribbled_in_small_pieces(server: TritiumProcess) -> None:
    # Frame headers and a large DATA frame cut at every kind of boundary, one small send
    # each (TCP_NODELAY): the server must reassemble them whatever it reads at a time.
    values = np.arange(40_000, dtype=np.float32)
    message = grpc_message(infer_request("identity_fp32", values, "dribbled"))
    raw = RawClient(grpc_port(server), {Setting.INITIAL_WINDOW_SIZE: 1 << 24})
    try:
        raw.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        raw.send(window_update(0, 1 << 24))
        wire = (frame(FrameType.HEADERS, END_HEADERS, 1, raw.block(request_headers()))
                + frame(FrameType.DATA, 0, 1, message[:7])
                + frame(FrameType.DATA, END_STREAM, 1, message[7:]))
        for start, step in ((0, 1), (40, 3), (64, 7), (200, 4096)):
            end = {0: 40, 40: 64, 64: 200, 200: len(wire)}[start]
            for offset in range(start, end, step):
                raw.send(wire[offset:min(offset + step, end)])
        reply = raw.reply(1)
        assert reply.status == 0, reply.message
        response = reply.infer_response()
        assert response.id == "dribbled"
        np.testing.assert_array_equal(first_output(response), values)
    finally:
        raw.close()


def test_a_repeated_header_block_is_read_against_the_current_table(raw: RawClient) -> None:
    # The server remembers blocks made only of table references; once the table has moved,
    # the same bytes name other headers and must be decoded again.
    message = grpc_message(identity_request([1.0], "repeated"))
    raw.send(frame(FrameType.HEADERS, END_HEADERS, 1, raw.block(request_headers())),
             frame(FrameType.DATA, END_STREAM, 1, message))
    assert raw.reply(1).status == 0
    repeat = raw.block(request_headers())
    assert references_only(repeat)
    for stream_id in (3, 5):
        raw.send(frame(FrameType.HEADERS, END_HEADERS, stream_id, repeat),
                 frame(FrameType.DATA, END_STREAM, stream_id, message))
        assert raw.reply(stream_id).status == 0
    # A new :path enters the table as its newest entry and shifts every older one by one...
    unknown = request_headers("/no.Such/Method")
    raw.send(frame(FrameType.HEADERS, END_HEADERS | END_STREAM, 7, raw.block(unknown)))
    assert raw.reply(7).status == GrpcStatus.UNIMPLEMENTED
    # ...so the old bytes now end with a reference to that path.
    raw.send(frame(FrameType.HEADERS, END_HEADERS, 9, repeat),
             frame(FrameType.DATA, END_STREAM, 9, message))
    reply = raw.reply(9)
    assert reply.status == GrpcStatus.UNIMPLEMENTED, reply.message
    assert "/no.Such/Method" in reply.message


def test_priority_frames_are_ignored(raw: RawClient) -> None:
    raw.send(frame(FrameType.PRIORITY, 0, 1, (0).to_bytes(4, "big") + b"\x20"),
             frame(FrameType.HEADERS, END_HEADERS, 1, raw.block(request_headers())),
             frame(FrameType.PRIORITY, 0, 1, (0).to_bytes(4, "big") + b"\x20"),
             frame(0xEE, 0, 0, b"an extension frame"),  # unknown types are ignored too
             frame(FrameType.DATA, END_STREAM, 1, grpc_message(identity_request([1.0], "p"))))
    assert raw.reply(1).infer_response().id == "p"


def unary_frames(raw: RawClient, stream_id: int, message: bytes) -> list[bytes]:
    return [frame(FrameType.HEADERS, END_HEADERS, stream_id, raw.block(request_headers())),
            frame(FrameType.DATA, END_STREAM, stream_id, grpc_message(message))]


def test_a_stream_depending_on_itself_is_reset(raw: RawClient) -> None:
    """RFC 9113 5.3.1: a self-dependency is a stream error; the connection serves on."""
    raw.send(frame(FrameType.HEADERS, END_HEADERS, 1, raw.block(request_headers())),
             frame(FrameType.PRIORITY, 0, 1, (1).to_bytes(4, "big") + b"\x20"))
    assert raw.reply(1).reset == H2Error.PROTOCOL_ERROR
    raw.send(frame(FrameType.PRIORITY, 0, 3, (3).to_bytes(4, "big") + b"\x20"))
    assert raw.reply(3).reset == H2Error.PROTOCOL_ERROR  # an idle stream: reset all the same
    raw.send(*unary_frames(raw, 5, identity_request([1.0], "after")))
    assert raw.reply(5).infer_response().id == "after"


MALFORMED_FIELDS = {
    "upper-case name": [(b"X-Upper", b"1")],
    "connection": [(b"connection", b"keep-alive")],
    "transfer-encoding": [(b"transfer-encoding", b"chunked")],
    "te other than trailers": [(b"te", b"gzip")],
}


@pytest.mark.parametrize("fields", MALFORMED_FIELDS.values(), ids=MALFORMED_FIELDS.keys())
def test_malformed_header_fields_reset_the_stream(raw: RawClient,
                                                  fields: list[tuple[bytes, bytes]]) -> None:
    """RFC 9113 8.2.1/8.2.2: upper-case names and connection-specific fields make the
    request malformed: a stream error (PROTOCOL_ERROR), and the next call is served."""
    headers = [(name, value) for name, value in request_headers() if name != b"te"]
    if fields[0][0] != b"te":
        headers.append((b"te", b"trailers"))
    raw.send(frame(FrameType.HEADERS, END_HEADERS | END_STREAM, 1, raw.block(headers + fields)))
    assert raw.reply(1).reset == H2Error.PROTOCOL_ERROR
    raw.send(*unary_frames(raw, 3, identity_request([1.0], "after")))
    assert raw.reply(3).infer_response().id == "after"


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_request_message(client: H2Client, encoding: str) -> None:
    body = identity_request([9.0] * 1000, "zipped")
    packed = gzip.compress(body) if encoding == "gzip" else zlib.compress(body)
    assert len(packed) < len(body)
    reply = client.unary(grpc_message(packed, compressed=True),
                         request_headers(grpc_encoding=encoding))
    assert "gzip" in reply.headers["grpc-accept-encoding"]
    response = reply.infer_response()
    assert response.id == "zipped"
    assert first_output(response).tolist() == [9.0] * 1000


def test_uncompressed_message_under_a_grpc_encoding(client: H2Client) -> None:
    reply = client.unary(grpc_message(identity_request([1.0], "plain")),
                         request_headers(grpc_encoding="gzip"))
    assert reply.infer_response().id == "plain"


def test_compressed_flag_without_an_encoding(client: H2Client) -> None:
    reply = client.unary(grpc_message(gzip.compress(identity_request([1.0])), compressed=True))
    assert reply.status == 13 and "grpc-encoding" in reply.message


def test_corrupt_compressed_message(client: H2Client) -> None:
    reply = client.unary(grpc_message(b"not gzip at all", compressed=True),
                         request_headers(grpc_encoding="gzip"))
    assert reply.status == 13 and "corrupt" in reply.message


# ======================================================================= refused calls


def test_unknown_method(client: H2Client) -> None:
    reply = client.unary(grpc_message(b""), request_headers(f"{SERVICE}/NoSuchMethod"))
    assert reply.headers[":status"] == "200"  # a trailers-only response
    assert reply.status == 12
    assert "NoSuchMethod" in reply.message
    assert not reply.data


def test_unknown_method_with_end_stream_on_headers(client: H2Client) -> None:
    stream_id = client.start(request_headers("/no.Such/Method"), end_stream=True)
    [reply] = client.wait(stream_id)
    assert reply.status == 12 and reply.reset is None


@pytest.mark.parametrize("headers", [
    request_headers(content_type="application/json"),
    request_headers(content_type="text/plain"),
    [(k, v) for k, v in request_headers() if k != b"content-type"],
])
def test_bad_content_type(client: H2Client, headers: list[tuple[bytes, bytes]]) -> None:
    reply = client.unary(grpc_message(identity_request([1.0])), headers)
    assert reply.headers[":status"] == "415"
    assert reply.status is None


def test_get_method_is_refused(client: H2Client) -> None:
    headers = request_headers()
    headers[0] = (b":method", b"GET")
    stream_id = client.start(headers, end_stream=True)
    [reply] = client.wait(stream_id)
    assert reply.headers[":status"] == "415"


@pytest.mark.parametrize("encoding", ["br", "snappy"])
def test_unsupported_grpc_encoding(client: H2Client, encoding: str) -> None:
    reply = client.unary(grpc_message(b"\x00" * 10, compressed=True),
                         request_headers(grpc_encoding=encoding))
    assert reply.status == 12 and encoding in reply.message


@pytest.mark.parametrize("timeout", ["", "5", "S", "123456789S", "5x", "-5S", "1.5S"])
def test_malformed_grpc_timeout(client: H2Client, timeout: str) -> None:
    reply = client.unary(grpc_message(identity_request([1.0])),
                         request_headers(grpc_timeout=timeout))
    assert reply.status == 3, reply
    assert "grpc-timeout" in reply.message


def test_well_formed_grpc_timeout_is_accepted(client: H2Client) -> None:
    reply = client.unary(grpc_message(identity_request([1.0], "t")),
                         request_headers(grpc_timeout="10S"))
    assert reply.infer_response().id == "t"


@pytest.mark.parametrize("body", [b"\xff\xff\xff", b"\x0a\xff\xff\xff\xff", b"\x0a\x05ab"])
def test_unparsable_message(client: H2Client, body: bytes) -> None:
    reply = client.unary(grpc_message(body))
    assert reply.status == 3 and "parse" in reply.message


def test_unary_without_a_message(client: H2Client) -> None:
    stream_id = client.start(end_stream=True)
    [reply] = client.wait(stream_id)
    assert reply.status not in (None, 0)
    assert not reply.data


def test_unary_with_two_messages(client: H2Client) -> None:
    message = grpc_message(identity_request([1.0]))
    reply = client.unary(message + message)
    assert reply.status not in (None, 0)
    assert not reply.data


def test_unary_with_an_incomplete_message(client: H2Client) -> None:
    reply = client.unary(grpc_message(identity_request([1.0]))[:-3])
    assert reply.status not in (None, 0)
    assert not reply.data


def test_message_over_the_size_limit(client: H2Client) -> None:
    reply = client.unary(b"\x00\xff\xff\xff\xff" + b"\x00" * 16)  # 4 GiB announced
    assert reply.status == 8 and "larger than max" in reply.message


def test_stream_call_over_h2(client: H2Client) -> None:
    stream_id = client.start(request_headers(f"{SERVICE}/ModelStreamInfer"))
    client.send(stream_id, grpc_message(identity_request([1.0], "s1"))
                + grpc_message(identity_request([2.0], "s2")))
    [reply] = client.wait(stream_id)
    assert reply.status == 0, reply.message
    answers = [pb.ModelStreamInferResponse.FromString(m) for m in reply.messages()]
    assert sorted(a.infer_response.id for a in answers) == ["s1", "s2"]
    assert all(not a.error_message for a in answers)


def test_error_message_is_percent_encoded(client: H2Client) -> None:
    reply = client.unary(grpc_message(infer_request("mod\u00e8le_100%", np.array([1.0]))))
    assert reply.status not in (None, 0), reply
    raw_message = reply.trailers.get("grpc-message", reply.headers.get("grpc-message", ""))
    assert raw_message.isascii() and "mod%C3%A8le_100%25" in raw_message
    assert "mod\u00e8le_100%" in reply.message


# ======================================================================== flow control


def test_response_respects_a_small_client_window(server: TritiumProcess) -> None:
    stream_grant, connection_grant = 24_000, 100_000  # neither a multiple of 16384
    values = np.arange(200_000, dtype=np.float32)
    client = H2Client(grpc_port(server), initial_window=1000)
    try:
        stream_id = client.start()
        client.send(stream_id, grpc_message(infer_request("identity_fp32", values, "window")))
        stream_window, connection_window, grants = 1000, 65535, 0
        reply = client.replies[stream_id]
        while stream_id not in client.ended:
            seen = len(reply.frames)
            client.receive(acknowledge=False)  # h2 raises FlowControlError on an overrun
            for size in reply.frames[seen:]:
                stream_window -= size
                connection_window -= size
                assert size <= MAX_DATA_FRAME
                assert stream_window >= 0 and connection_window >= 0
            # Credit only once a window is spent: the server has to wait for it.
            if stream_window == 0:
                client.conn.increment_flow_control_window(stream_grant, stream_id)
                stream_window, grants = stream_grant, grants + 1
            if connection_window == 0:
                client.conn.increment_flow_control_window(connection_grant)
                connection_window, grants = connection_grant, grants + 1
            client.flush()
    finally:
        client.close()
    assert reply.reset is None and reply.status == 0, reply.message
    assert np.array_equal(first_output(reply.infer_response()), values)
    assert grants > 30  # ~800 KB through 24 KB stream grants
    assert max(reply.frames) <= MAX_DATA_FRAME


def test_window_growth_by_settings_releases_a_blocked_response(server: TritiumProcess) -> None:
    values = np.arange(50_000, dtype=np.float32)
    client = H2Client(grpc_port(server), initial_window=1000)
    try:
        stream_id = client.start()
        client.send(stream_id, grpc_message(infer_request("identity_fp32", values, "grow")))
        reply = client.replies[stream_id]
        while sum(reply.frames) < 1000:
            client.receive(acknowledge=False)
        assert sum(reply.frames) == 1000 and stream_id not in client.ended
        # A larger INITIAL_WINDOW_SIZE grows the open stream's window (RFC 9113 §6.9.2).
        client.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 20})
        client.conn.increment_flow_control_window(1 << 20)
        client.flush()
        client.wait(stream_id)
    finally:
        client.close()
    assert np.array_equal(first_output(reply.infer_response()), values)


def test_reset_while_the_response_waits_for_window(raw: RawClient) -> None:
    raw.send(frame(FrameType.SETTINGS, 0, 0, settings_payload({Setting.INITIAL_WINDOW_SIZE: 1000})),
             _headers(raw, 1), frame(FrameType.DATA, END_STREAM, 1, grpc_message(
                 infer_request("identity_fp32", np.arange(50_000, dtype=np.float32), "rst"))))
    received = 0
    while received < 1000:
        found = raw.read()
        assert found is not None
        if found.kind == FrameType.DATA:
            assert found.stream_id == 1
            received += len(found.payload)
    assert received == 1000
    # Reset the blocked stream, grant it credit anyway, and start another call.
    raw.send(frame(FrameType.RST_STREAM, 0, 1, int(H2Error.CANCEL).to_bytes(4, "big")),
             window_update(1, 1 << 20), window_update(0, 1 << 20), _headers(raw, 3),
             frame(FrameType.DATA, END_STREAM, 3, grpc_message(identity_request([1.0], "next"))))
    stray = []
    while True:
        found = raw.read()
        assert found is not None, "connection closed"
        if found.stream_id == 1 and found.kind in (FrameType.DATA, FrameType.HEADERS):
            stray.append(found)
        if found.stream_id == 3 and found.kind == FrameType.HEADERS:
            break
    assert stray == [], "the server kept sending on a stream the client reset"


def test_large_response_with_default_windows(client: H2Client) -> None:
    values = np.arange(300_000, dtype=np.float32)
    reply = client.unary(grpc_message(infer_request("identity_fp32", values, "large")))
    assert np.array_equal(first_output(reply.infer_response()), values)
    assert max(reply.frames) <= MAX_DATA_FRAME


# ======================================================================= ending early


def test_rst_stream_cancels_the_request(server: TritiumProcess, client: H2Client,
                                        slow: Records) -> None:
    rid = new_id()
    before = cancellations(server, "CLIENT_CANCELLED")
    stream_id = client.start()
    client.send(stream_id, grpc_message(slow_request(5, rid)))
    slow.wait_for(rid, "start", timeout=TIMEOUT_S)
    left_at = time.monotonic()
    client.conn.reset_stream(stream_id, ErrorCodes.CANCEL)
    client.flush()
    assert_stopped_soon(slow, rid, left_at)
    wait_for_metric(server.metrics_url, CANCELLED, before + 1, timeout=TIMEOUT_S, model="slow",
                    reason="CLIENT_CANCELLED", stage="executing")
    # The connection carries on.
    reply = client.unary(grpc_message(identity_request([1.0], "after-reset")))
    assert reply.infer_response().id == "after-reset"


def test_grpc_timeout_ends_the_call(server: TritiumProcess, client: H2Client,
                                    slow: Records) -> None:
    rid = new_id()
    before = cancellations(server, "DEADLINE")
    started = time.monotonic()
    reply = client.unary(grpc_message(slow_request(5, rid)), request_headers(grpc_timeout="300m"))
    elapsed = time.monotonic() - started
    assert reply.status == 4, reply
    assert reply.message == "Deadline Exceeded"
    assert 0.25 < elapsed < 4.0
    assert_stopped_soon(slow, rid, started + 0.3)
    wait_for_metric(server.metrics_url, CANCELLED, before + 1, timeout=TIMEOUT_S, model="slow",
                    reason="DEADLINE", stage="executing")


def test_grpc_timeout_before_the_request_arrives(client: H2Client) -> None:
    stream_id = client.start(request_headers(grpc_timeout="100m"))
    [reply] = client.wait(stream_id)  # no message is ever sent
    assert reply.status == 4 and reply.headers[":status"] == "200"
    # The stream is over on the server; it says so rather than waiting for the request.
    assert reply.reset in (None, ErrorCodes.NO_ERROR)


def test_dropped_connection_cancels_the_request(server: TritiumProcess, slow: Records) -> None:
    rid = new_id()
    before = cancellations(server, "CLIENT_DISCONNECTED")
    client = H2Client(grpc_port(server))
    stream_id = client.start()
    client.send(stream_id, grpc_message(slow_request(5, rid)))
    slow.wait_for(rid, "start", timeout=TIMEOUT_S)
    left_at = time.monotonic()
    client.close()
    assert_stopped_soon(slow, rid, left_at)
    wait_for_metric(server.metrics_url, CANCELLED, before + 1, timeout=TIMEOUT_S, model="slow",
                    reason="CLIENT_DISCONNECTED", stage="executing")
    assert_still_serving(server)


# ================================================================= protocol violations


def _headers(raw: RawClient, stream_id: int, flags: int = END_HEADERS) -> bytes:
    return frame(FrameType.HEADERS, flags, stream_id, raw.block(request_headers()))


VIOLATIONS = {
    "data-on-stream-0": (lambda r: [frame(FrameType.DATA, 0, 0, b"x")],
                         H2Error.PROTOCOL_ERROR),
    "data-on-idle-stream": (lambda r: [frame(FrameType.DATA, 0, 5, b"x")],
                            H2Error.PROTOCOL_ERROR),
    "settings-length": (lambda r: [frame(FrameType.SETTINGS, 0, 0, b"\x00" * 5)],
                        H2Error.FRAME_SIZE_ERROR),
    "settings-on-stream": (lambda r: [frame(FrameType.SETTINGS, 0, 1, b"")],
                           H2Error.PROTOCOL_ERROR),
    "window-too-large": (lambda r: [frame(FrameType.SETTINGS, 0, 0, settings_payload(
        {Setting.INITIAL_WINDOW_SIZE: 2**31}))], H2Error.FLOW_CONTROL_ERROR),
    "max-frame-size-too-small": (lambda r: [frame(FrameType.SETTINGS, 0, 0, settings_payload(
        {Setting.MAX_FRAME_SIZE: 100}))], H2Error.PROTOCOL_ERROR),
    "ping-7-bytes": (lambda r: [frame(FrameType.PING, 0, 0, b"1234567")],
                     H2Error.FRAME_SIZE_ERROR),
    "ping-9-bytes": (lambda r: [frame(FrameType.PING, 0, 0, b"123456789")],
                     H2Error.FRAME_SIZE_ERROR),
    "push-promise": (lambda r: [frame(FrameType.PUSH_PROMISE, END_HEADERS, 1,
                                      (2).to_bytes(4, "big"))], H2Error.PROTOCOL_ERROR),
    "frame-over-1MiB": (lambda r: [((2**20 + 1) << 8 | FrameType.DATA).to_bytes(4, "big")
                                   + b"\x00\x00\x00\x00\x01"], H2Error.FRAME_SIZE_ERROR),
    "continuation-alone": (lambda r: [frame(FrameType.CONTINUATION, END_HEADERS, 1, b"")],
                           H2Error.PROTOCOL_ERROR),
    "header-block-interrupted": (lambda r: [_headers(r, 1, 0),
                                            frame(FrameType.PING, 0, 0, b"8 bytes!")],
                                 H2Error.PROTOCOL_ERROR),
    "continuation-other-stream": (lambda r: [_headers(r, 1, 0),
                                             frame(FrameType.CONTINUATION, END_HEADERS, 3, b"")],
                                  H2Error.PROTOCOL_ERROR),
    "headers-on-stream-0": (lambda r: [_headers(r, 0)], H2Error.PROTOCOL_ERROR),
    "even-stream-id": (lambda r: [_headers(r, 2)], H2Error.PROTOCOL_ERROR),
    "bad-hpack": (lambda r: [frame(FrameType.HEADERS, END_HEADERS, 1, b"\xff\xff\xff\xff")],
                  H2Error.COMPRESSION_ERROR),
    "zero-window-update": (lambda r: [window_update(0, 0)], H2Error.PROTOCOL_ERROR),
    "window-update-length": (lambda r: [frame(FrameType.WINDOW_UPDATE, 0, 0, b"\x00\x01")],
                             H2Error.FRAME_SIZE_ERROR),
    "window-overflow": (lambda r: [window_update(0, 2**31 - 1)], H2Error.FLOW_CONTROL_ERROR),
    "header-list-too-large": (lambda r: [frame(FrameType.HEADERS, END_HEADERS, 1, r.block(
        [*request_headers(), (b"x-big", b"v" * 70_000)]))], H2Error.COMPRESSION_ERROR),
    "header-block-too-large": (lambda r: [
        frame(FrameType.HEADERS, 0, 1, r.block(request_headers())),
        *[frame(FrameType.CONTINUATION, 0, 1, b"\x00" * 16_000) for _ in range(5)]],
        H2Error.ENHANCE_YOUR_CALM),
    "padding-too-long": (lambda r: [_headers(r, 1), frame(FrameType.DATA, PADDED, 1, b"\x09ab")],
                         H2Error.PROTOCOL_ERROR),
}


@pytest.mark.parametrize("case", list(VIOLATIONS))
def test_protocol_violation_ends_the_connection(server: TritiumProcess, raw: RawClient,
                                                case: str) -> None:
    build, code = VIOLATIONS[case]
    raw.send(*build(raw))
    goaway = raw.until(FrameType.GOAWAY)
    assert goaway_code(goaway) == code, goaway.payload[8:]
    assert goaway.payload[8:], "GOAWAY carries no debug text"
    assert raw.remaining() == []  # closed right after the GOAWAY
    assert_still_serving(server)


def test_data_after_end_stream_is_a_stream_error(server: TritiumProcess, raw: RawClient,
                                                 slow: Records) -> None:
    # RFC 9113 §5.1: a stream the client half-closed gets STREAM_CLOSED on that stream only.
    rid = new_id()
    before = cancellations(server, "CLIENT_CANCELLED")
    raw.send(_headers(raw, 1), frame(FrameType.DATA, END_STREAM, 1,
                                     grpc_message(slow_request(5, rid))))
    slow.wait_for(rid, "start", timeout=TIMEOUT_S)
    left_at = time.monotonic()
    raw.send(frame(FrameType.DATA, 0, 1, b"more"))
    reset = raw.until(FrameType.RST_STREAM, 1)
    assert int.from_bytes(reset.payload, "big") == H2Error.STREAM_CLOSED
    assert_stopped_soon(slow, rid, left_at)
    wait_for_metric(server.metrics_url, CANCELLED, before + 1, timeout=TIMEOUT_S, model="slow",
                    reason="CLIENT_CANCELLED", stage="executing")
    # The connection goes on serving.
    raw.send(_headers(raw, 3), frame(FrameType.DATA, END_STREAM, 3,
                                     grpc_message(identity_request([1.0], "after"))))
    assert raw.reply(3).infer_response().id == "after"


def test_violation_after_a_good_call_on_the_same_connection(server: TritiumProcess,
                                                             raw: RawClient) -> None:
    raw.send(_headers(raw, 1), frame(FrameType.DATA, END_STREAM, 1,
                                     grpc_message(identity_request([1.0], "good"))))
    assert raw.reply(1).infer_response().id == "good"
    raw.send(frame(FrameType.DATA, 0, 0, b"x"))
    goaway = raw.until(FrameType.GOAWAY)
    assert goaway_code(goaway) == H2Error.PROTOCOL_ERROR
    assert int.from_bytes(goaway.payload[:4], "big") == 1
    assert raw.remaining() == []
    assert_still_serving(server)


def _exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def split_frames(data: bytes) -> tuple[list[Frame], bytes]:
    """The whole HTTP/2 frames at the start of ``data`` and what follows them."""
    frames = []
    while len(data) >= 9 and data[3] in (FrameType.SETTINGS, FrameType.WINDOW_UPDATE):
        length = int.from_bytes(data[:3], "big")
        frames.append(Frame(data[3], data[4], int.from_bytes(data[5:9], "big"),
                            data[9:9 + length]))
        data = data[9 + length:]
    return frames, data


HTTP1_REQUESTS = [b"GET / HTTP/1.1", b"POST /v2/models HTTP/1.1"]


@pytest.mark.parametrize("request_line", HTTP1_REQUESTS)
def test_http1_request_gets_a_400_and_a_close(server: TritiumProcess,
                                              request_line: bytes) -> None:
    answer = _exchange(grpc_port(server), request_line + b"\r\nHost: x\r\n\r\n")
    _, http1 = split_frames(answer)
    assert http1.startswith(b"HTTP/1.1 400 ")
    assert b"gRPC" in http1.partition(b"\r\n\r\n")[2]
    assert_still_serving(server)


@pytest.mark.parametrize("request_line", HTTP1_REQUESTS)
def test_http1_request_gets_a_parsable_400(server: TritiumProcess, request_line: bytes) -> None:
    answer = _exchange(grpc_port(server), request_line + b"\r\nHost: x\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 ")


@pytest.mark.parametrize("garbage", [b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
                                     b"PRI * HTTP/1.1\r\n\r\n"])
def test_other_garbage_is_closed_without_an_answer(server: TritiumProcess,
                                                   garbage: bytes) -> None:
    # Not even the server's side of the preface: that waits for the client's.
    assert _exchange(grpc_port(server), garbage) == b""
    assert_still_serving(server)
