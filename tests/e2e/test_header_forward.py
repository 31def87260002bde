"""--http-header-forward-pattern / --grpc-header-forward-pattern on a real server: matching
request headers reach the model as string parameters, over HTTP /infer, gRPC ModelInfer
and every request of a ModelStreamInfer stream."""

from __future__ import annotations

import contextlib
import json
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.bystander import Bystander, health_url
from tests.e2e.test_grpc_raw import (
    RawClient,
    grpc_message,
    grpc_port,
    infer_request,
    request_headers,
)
from tests.server_process import TritiumProcess
from tests.zoo import add_model
from tritium.frontends.grpc.http2 import END_HEADERS, END_STREAM, FrameType, frame

CONFIG = ('backend: "python"\n'
          'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [1] }]\n'
          'output [{ name: "PARAMS" data_type: TYPE_STRING dims: [1] }]\n')
# As Triton's L0_parameters test sends them: lower-case names, a value with quotes and a
# backslash, and a header the pattern does not match.
# The clients add their own headers to the dict they are given: each call gets a copy.
HEADERS = {"my_header_1": "my_value_1", "my_header_2": 'a "quoted" string\\ ',
           "other_header": "not forwarded"}
FORWARDED = {"my_header_1": "my_value_1", "my_header_2": 'a "quoted" string\\ '}


def start(tmp_path: Path, pattern: str) -> TritiumProcess:
    add_model(tmp_path / "repo", "parameters_echo", "parameters_echo", CONFIG)
    return TritiumProcess(tmp_path / "repo", "--http-header-forward-pattern", pattern,
                          "--grpc-header-forward-pattern", pattern).start()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritiumProcess]:
    process = start(tmp_path_factory.mktemp("forward"), "MY_HEADER.*")
    yield process
    assert process.stop() == 0, process.log()


@pytest.fixture(scope="module")
def everything(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritiumProcess]:
    process = start(tmp_path_factory.mktemp("forward_all"), ".*")
    yield process
    assert process.stop() == 0, process.log()


def http_infer(server: TritiumProcess, headers: dict[str, str]) -> dict[str, Any]:
    with httpclient.InferenceServerClient(server.http_url) as client:
        tensor = httpclient.InferInput("INPUT0", [1], "FP32")
        tensor.set_data_from_numpy(np.zeros(1, np.float32))
        result = client.infer("parameters_echo", [tensor], headers=dict(headers),
                              parameters={"body_param": 7})
    return dict(json.loads(result.as_numpy("PARAMS")[0]))


def grpc_input() -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, np.float32))
    return tensor


def grpc_infer(server: TritiumProcess, headers: dict[str, str]) -> dict[str, Any]:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        result = client.infer("parameters_echo", [grpc_input()], headers=dict(headers),
                              parameters={"body_param": 7})
    return dict(json.loads(result.as_numpy("PARAMS")[0]))


def grpc_stream_infer(server: TritiumProcess, headers: dict[str, str]) -> list[dict[str, Any]]:
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(lambda result, error: results.put((result, error)),
                            headers=dict(headers))
        for _ in range(2):
            client.async_stream_infer("parameters_echo", [grpc_input()],
                                      parameters={"body_param": 7})
        client.stop_stream()
    found = []
    for _ in range(2):
        result, error = results.get(timeout=30)
        assert error is None, error
        found.append(dict(json.loads(result.as_numpy("PARAMS")[0])))
    return found


def test_http_infer_forwards_matching_headers(server: TritiumProcess) -> None:
    """Triton's parameters test: with "MY_HEADER.*" (matched ignoring case) the model sees
    exactly its body parameters plus the matching headers, as strings."""
    assert http_infer(server, HEADERS) == {"body_param": 7, **FORWARDED}


def test_grpc_infer_forwards_matching_metadata(server: TritiumProcess) -> None:
    assert grpc_infer(server, HEADERS) == {"body_param": 7, **FORWARDED}


def test_grpc_stream_forwards_the_stream_headers_to_each_request(server: TritiumProcess
                                                                 ) -> None:
    """Triton's stream handler forwards the stream's metadata for every request read."""
    assert grpc_stream_infer(server, HEADERS) == [{"body_param": 7, **FORWARDED}] * 2


def test_generate_does_not_forward(server: TritiumProcess) -> None:
    """Triton forwards headers on /infer only; its generate handler never reads them."""
    reply = requests.post(f"http://{server.http_url}/v2/models/parameters_echo/generate",
                          json={"INPUT0": 0.0}, headers=HEADERS, timeout=30)
    assert reply.status_code == 200, reply.text
    assert json.loads(reply.json()["PARAMS"]) == {}


def test_a_match_all_pattern_forwards_metadata_but_not_the_protocol(
        everything: TritiumProcess) -> None:
    """With ".*" every client header is forwarded; gRPC's pseudo-headers and protocol
    fields are not metadata in a gRPC server, so they are never among them."""
    found = grpc_infer(everything, {"my_header_1": "x"})
    assert found["my_header_1"] == "x" and found["body_param"] == 7
    assert not [name for name in found if name.startswith(":")]
    assert not {"te", "content-type", "grpc-accept-encoding"} & set(found)
    assert http_infer(everything, {"my_header_1": "x"})["my_header_1"] == "x"


@pytest.mark.parametrize("name", ["timeout", "priority", "triton_anything"])
def test_a_reserved_header_that_matches_is_refused(everything: TritiumProcess,
                                                   name: str) -> None:
    """Triton refuses the request: "Header '<name>' is reserved for Triton usage and
    cannot be forwarded." (400 over HTTP, INVALID_ARGUMENT over gRPC)."""
    words = f"Header '{name}' is reserved for Triton usage and cannot be forwarded."
    reply = requests.post(f"http://{everything.http_url}/v2/models/parameters_echo/infer",
                          json={"inputs": [{"name": "INPUT0", "shape": [1],
                                            "datatype": "FP32", "data": [0]}]},
                          headers={name: "1"}, timeout=30)
    assert reply.status_code == 400 and reply.json()["error"] == words
    with pytest.raises(InferenceServerException) as caught:
        grpc_infer(everything, {name: "1"})
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert words in str(caught.value.message())


@pytest.fixture(scope="module")
def tracing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritiumProcess]:
    process = start(tmp_path_factory.mktemp("forward_trace"), ".*trace.*")
    yield process
    assert process.stop() == 0, process.log()


def test_long_header_names_never_stall_the_server(tracing: TritiumProcess) -> None:
    """The patterns that backtrack in a regex engine that does (".*trace.*" against a
    60,000-character name took 28 s) are matched in linear time: the request is answered
    and an unrelated client keeps being served meanwhile, over HTTP and gRPC."""
    bystander = Bystander(health_url(tracing.http_url))
    with bystander.watching() as latencies:
        for _ in range(3):
            found = http_infer(tracing, {"a" * 60_000: "x", "x-trace-id": "7"})
            assert found == {"body_param": 7, "x-trace-id": "7"}
            with contextlib.closing(RawClient(grpc_port(tracing))) as raw:
                request = grpc_message(infer_request("parameters_echo",
                                                     np.zeros(1, np.float32), "long"))
                raw.send(frame(FrameType.HEADERS, END_HEADERS, 1, raw.block(
                    request_headers(**{"b" * 30_000: "x"}))),
                    frame(FrameType.DATA, END_STREAM, 1, request))
                assert raw.reply(1).infer_response().id == "long"
    bystander.close()
    bystander.assert_served(latencies)
