"""Hostile big requests against the real server: each gets its 4xx while an unrelated small
inference over the other protocol is still answered promptly."""

from __future__ import annotations

import contextlib
import json
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from tests.e2e.bystander import peak_rss_bytes
from tests.server_process import TritiumProcess

# Thread kind only: hostile bodies are decoded (or refused) by the frontends off the loop; big
# tensors through the process kind's shared memory are covered by test_process_instances and
# test_process_bridge.
INSTANCE_KINDS = ("thread",)

pytestmark = pytest.mark.e2e

BODY_LIMIT = 60 * 1000 * 1000  # under the default --http-max-input-size of 64 MiB
# Generous: the target is 100 ms, but the machine is shared and loaded. Each hostile request
# below held the event loop for 3.7 s (JSON) to over 10 s (BYTES) before it was fixed.
PROMPT_S = 2.0


def mixed_bytes(total: int) -> tuple[bytes, int]:
    """BYTES serialization of alternating empty and one-byte elements: sizes that never
    repeat, so nothing can split it with one vector operation."""
    pair = struct.pack("<I", 0) + struct.pack("<I", 1) + b"x"
    pairs = total // len(pair)
    return pair * pairs, 2 * pairs


def http_bytes_body(raw: bytes, shape: list[int]) -> tuple[bytes, dict[str, str]]:
    header = json.dumps({"inputs": [{
        "name": "INPUT0", "shape": shape, "datatype": "BYTES",
        "parameters": {"binary_data_size": len(raw)}}]}).encode()
    return header + raw, {"Inference-Header-Content-Length": str(len(header))}


class Hostile:
    """Runs one big request on a thread; ``result`` is what it returned (or raised)."""

    def __init__(self, send: Callable[[], Any]):
        self.result: Any = None
        self.sent = threading.Event()
        self._send = send
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.result = self._send()
        except Exception as exc:  # the test inspects it
            self.result = exc
        finally:
            self.sent.set()

    @contextlib.contextmanager
    def running(self) -> Iterator[Hostile]:
        self._thread.start()
        yield self
        assert self.sent.wait(120), "the hostile request was never answered"
        self._thread.join()


def latencies_while(hostile: Hostile, small: Callable[[], None]) -> list[float]:
    """Run ``small`` over and over until the hostile request is answered (at least twice)."""
    times: list[float] = []
    while not hostile.sent.is_set() or len(times) < 2:
        start = time.monotonic()
        small()
        times.append(time.monotonic() - start)
    return times


@pytest.fixture(scope="module")
def grpc_identity(server: TritiumProcess) -> Iterator[Callable[[], None]]:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.ports['gRPC']}")
    values = np.arange(4, dtype=np.float32)

    def infer() -> None:
        data = grpcclient.InferInput("INPUT0", [4], "FP32")
        data.set_data_from_numpy(values)
        result = client.infer("identity_fp32", [data], client_timeout=30)
        assert result.as_numpy("OUTPUT0").tolist() == values.tolist()

    yield infer
    client.close()


@pytest.fixture(scope="module")
def http_identity(server: TritiumProcess) -> Iterator[Callable[[], None]]:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.ports['HTTP']}",
                                              network_timeout=30)
    values = np.arange(4, dtype=np.float32)

    def infer() -> None:
        data = httpclient.InferInput("INPUT0", [4], "FP32")
        data.set_data_from_numpy(values)
        result = client.infer("identity_fp32", [data])
        assert result.as_numpy("OUTPUT0").tolist() == values.tolist()

    yield infer
    client.close()


def http_post(server: TritiumProcess, model: str, body: bytes,
              headers: dict[str, str] | None = None) -> requests.Response:
    url = f"http://127.0.0.1:{server.ports['HTTP']}/v2/models/{model}/infer"
    return requests.post(url, data=body, headers=headers or {}, timeout=120)


def assert_prompt(times: list[float]) -> None:
    assert max(times) < PROMPT_S, f"slowest small inference took {max(times):.3f} s"


def test_mixed_bytes_split_off_the_loop_http(
    server: TritiumProcess, grpc_identity: Callable[[], None]
) -> None:
    raw, count = mixed_bytes(BODY_LIMIT)
    # One element more than the data holds: the whole split runs before the refusal.
    body, headers = http_bytes_body(raw, [count + 1])
    with Hostile(lambda: http_post(server, "identity_bytes", body, headers)).running() as hostile:
        times = latencies_while(hostile, grpc_identity)
    assert hostile.result.status_code == 400, hostile.result.text
    assert f"expected {count + 1} string elements" in hostile.result.json()["error"]
    assert_prompt(times)


def test_a_flood_of_empty_bytes_elements_is_served_without_stalling_others(
    server: TritiumProcess, grpc_identity: Callable[[], None]
) -> None:
    count = BODY_LIMIT // 4  # 15M empty strings: 13 s of the loop's time before the fix
    header = json.dumps({
        "inputs": [{"name": "INPUT0", "shape": [count], "datatype": "BYTES",
                    "parameters": {"binary_data_size": 4 * count}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()

    def send() -> requests.Response:
        return http_post(server, "identity_bytes", header + bytes(4 * count),
                         {"Inference-Header-Content-Length": str(len(header))})

    with Hostile(send).running() as hostile:
        times = latencies_while(hostile, grpc_identity)
    response = hostile.result
    assert response.status_code == 200, response.text[:300]
    length = int(response.headers["inference-header-content-length"])
    assert response.content[length:] == bytes(4 * count)
    assert_prompt(times)


def test_empty_bytes_for_a_model_without_bytes_inputs_refused_before_decoding(
    server: TritiumProcess, grpc_identity: Callable[[], None]
) -> None:
    count = BODY_LIMIT // 4
    body, headers = http_bytes_body(bytes(4 * count), [count])
    start = time.monotonic()
    with Hostile(lambda: http_post(server, "identity_fp32", body, headers)).running() as hostile:
        times = latencies_while(hostile, grpc_identity)
    assert hostile.result.status_code == 400
    assert "data-type is 'BYTES', but model 'identity_fp32' expects 'FP32'" in (
        hostile.result.json()["error"])
    assert time.monotonic() - start < 30
    assert_prompt(times)


def test_big_json_body_parsed_off_the_loop(
    server: TritiumProcess, grpc_identity: Callable[[], None]
) -> None:
    values = b",".join([b"1"] * (BODY_LIMIT // 2 - 100))
    # The shape is one short: the 400 comes only once the whole document is parsed.
    body = (b'{"inputs":[{"name":"INPUT0","shape":[1],"datatype":"FP32","data":['
            + values + b"]}]}")
    with Hostile(lambda: http_post(server, "identity_fp32", body)).running() as hostile:
        times = latencies_while(hostile, grpc_identity)
    assert hostile.result.status_code == 400
    assert "Shape does not match" in hostile.result.json()["error"]
    assert_prompt(times)


def test_mixed_bytes_split_off_the_loop_grpc(
    server: TritiumProcess, http_identity: Callable[[], None]
) -> None:
    raw, count = mixed_bytes(BODY_LIMIT)
    message = pb.ModelInferRequest(model_name="identity_bytes", raw_input_contents=[raw])
    message.inputs.add(name="INPUT0", datatype="BYTES", shape=[count + 1])
    channel = grpc.insecure_channel(f"127.0.0.1:{server.ports['gRPC']}", options=[
        ("grpc.max_send_message_length", 2**31 - 1)])
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    try:
        with Hostile(lambda: stub.ModelInfer(message, timeout=120)).running() as hostile:
            times = latencies_while(hostile, http_identity)
    finally:
        channel.close()
    error = hostile.result
    assert isinstance(error, grpc.RpcError), error
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert f"expected {count + 1} string elements" in (error.details() or "")
    assert_prompt(times)


@pytest.mark.parametrize("shape, message", [
    ([1] * 65, "has 65 dimensions, more than the 64 allowed"),
    ([2**40, 2**40, 2**40], "more elements than a tensor can"),
])
def test_absurd_shapes_are_invalid_on_both_protocols(
    server: TritiumProcess, shape: list[int], message: str
) -> None:
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": shape, "datatype": "FP32",
                                     "parameters": {"binary_data_size": 4}}]}).encode()
    response = http_post(server, "identity_fp32", header + bytes(4),
                         {"Inference-Header-Content-Length": str(len(header))})
    assert response.status_code == 400 and message in response.json()["error"]
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.ports['gRPC']}")
    try:
        data = grpcclient.InferInput("INPUT0", shape, "FP32")
        data._raw_content = bytes(4)  # tritonclient would refuse to build it otherwise
        with pytest.raises(grpcclient.InferenceServerException) as info:
            client.infer("identity_fp32", [data])
    finally:
        client.close()
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert message in str(info.value.message())


def test_big_binary_input_asked_back_as_json_streams_in_bounded_memory(
    server: TritiumProcess, grpc_identity: Callable[[], None]
) -> None:
    assert server.proc is not None
    pid = server.proc.pid
    values = np.random.default_rng(7).random(8 * 1024 * 1024, dtype=np.float32)  # 32 MiB
    header = json.dumps({
        "inputs": [{"name": "INPUT0", "shape": [values.size], "datatype": "FP32",
                    "parameters": {"binary_data_size": values.nbytes}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": False}}]}).encode()
    with open(f"/proc/{pid}/clear_refs", "w") as refs:
        refs.write("5")  # the peak RSS starts again from the current RSS
    before = peak_rss_bytes(pid)

    def send() -> requests.Response:
        return http_post(server, "identity_fp32", header + values.tobytes(),
                         {"Inference-Header-Content-Length": str(len(header))})

    with Hostile(send).running() as hostile:
        times = latencies_while(hostile, grpc_identity)
    response = hostile.result
    assert response.status_code == 200, response.text[:300]
    # The JSON is about 5 times the binary size; held whole, with the tensor as Python
    # floats on the way, it took the server up 17 times the input size.
    assert peak_rss_bytes(pid) - before < 4 * values.nbytes
    assert response.headers["transfer-encoding"] == "chunked"
    (output,) = response.json()["outputs"]
    assert np.array_equal(np.array(output["data"], dtype=np.float32), values)
    assert_prompt(times)
