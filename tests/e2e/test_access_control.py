"""Restricted API groups on a real server: refused without the header or with a wrong value,
served with it, and every other group served as before; HTTP and gRPC."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.server_process import TritiumProcess
from tests.zoo import add_model

# Thread kind only: which APIs a listener restricts, decided before any instance runs.
INSTANCE_KINDS = ("thread",)

MODEL = "identity_fp32"
INFER_KEY = {"infer-key": "k1"}
PROBE_KEY = {"probe-key": "p1"}
GRPC_INFER_KEY = {"triton-grpc-protocol-infer-key": "k1"}
GRPC_PROBE_KEY = {"triton-grpc-protocol-probe-key": "p1"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritiumProcess]:
    repo = tmp_path_factory.mktemp("acl_repo")
    add_model(repo, MODEL, "identity",
              'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [-1] }]\n'
              'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [-1] }]\n')
    process = TritiumProcess(
        repo,
        "--http-restricted-api", "inference,model-config:infer-key=k1",
        "--http-restricted-api", "health:probe-key=p1",
        "--grpc-restricted-protocol", "inference,model-config:infer-key=k1",
        "--grpc-restricted-protocol", "health:probe-key=p1",
    ).start()
    yield process
    assert process.stop() == 0, process.log()


# -- HTTP -------------------------------------------------------------------------------------

INFER_BODY = {"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}
RESTRICTED_HTTP = [
    ("POST", f"/v2/models/{MODEL}/infer", INFER_KEY),
    ("GET", f"/v2/models/{MODEL}/config", INFER_KEY),
    ("GET", "/v2/health/ready", PROBE_KEY),
    ("GET", "/v2/health/live", PROBE_KEY),
    ("GET", f"/v2/models/{MODEL}/ready", PROBE_KEY),
]


def http(server: TritiumProcess, method: str, path: str, headers: dict[str, str] | None = None
         ) -> requests.Response:
    body = INFER_BODY if method == "POST" else None
    return requests.request(method, f"http://{server.http_url}{path}", json=body,
                            headers=headers, timeout=30)


def wrong(headers: dict[str, str]) -> dict[str, str]:
    return {name: value + "x" for name, value in headers.items()}


@pytest.mark.parametrize(("method", "path", "key"), RESTRICTED_HTTP)
def test_http_restricted_group_refused_without_its_header(
        server: TritiumProcess, method: str, path: str, key: dict[str, str]) -> None:
    (name,) = key
    expected = {"error": f"This API is restricted, expecting header '{name}'"}
    for headers in (None, wrong(key), {name.upper(): key[name] + " "}):
        reply = http(server, method, path, headers)
        assert reply.status_code == 403, (headers, reply.text)
        assert reply.headers["Content-Type"] == "application/json"
        assert reply.json() == expected


@pytest.mark.parametrize(("method", "path", "key"), RESTRICTED_HTTP)
def test_http_restricted_group_served_with_its_header(
        server: TritiumProcess, method: str, path: str, key: dict[str, str]) -> None:
    (name,) = key
    for headers in (key, {name.upper(): key[name]}):  # header names match in any case
        reply = http(server, method, path, headers)
        assert reply.status_code == 200, reply.text


def test_http_another_groups_header_does_not_open_a_group(server: TritiumProcess) -> None:
    reply = http(server, "POST", f"/v2/models/{MODEL}/infer", {**PROBE_KEY, "k1": "infer-key"})
    assert reply.status_code == 403


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/v2"), ("GET", f"/v2/models/{MODEL}"), ("GET", "/v2/models/stats"),
    ("GET", f"/v2/models/{MODEL}/stats"), ("POST", "/v2/repository/index"),
    ("GET", "/v2/logging"), ("GET", "/v2/trace/setting"),
])
def test_http_unrestricted_groups_are_served_without_headers(
        server: TritiumProcess, method: str, path: str) -> None:
    reply = requests.request(method, f"http://{server.http_url}{path}", timeout=30)
    assert reply.status_code == 200, reply.text


def test_http_restriction_is_judged_before_the_method_and_not_for_unknown_paths(
        server: TritiumProcess) -> None:
    # As tritonserver: a restricted path answers 403 whatever the method.
    assert http(server, "DELETE", f"/v2/models/{MODEL}/infer").status_code == 403
    assert http(server, "DELETE", f"/v2/models/{MODEL}/infer", INFER_KEY).status_code == 405
    assert http(server, "GET", "/v2/nothing/here").status_code == 404


def test_tritonclient_http_passes_the_header(server: TritiumProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    inputs = [httpclient.InferInput("INPUT0", [2], "FP32")]
    inputs[0].set_data_from_numpy(np.array([3, 4], dtype=np.float32))
    with pytest.raises(InferenceServerException, match="expecting header 'infer-key'"):
        client.infer(MODEL, inputs)
    result = client.infer(MODEL, inputs, headers=dict(INFER_KEY))  # the client adds to it
    assert result.as_numpy("OUTPUT0").tolist() == [3, 4]
    assert client.is_server_ready(headers=dict(PROBE_KEY))
    assert not client.is_server_ready()  # 403 reads as "not ready" to tritonclient
    assert client.get_server_metadata()["name"] == "triton"
    client.close()


# -- gRPC -------------------------------------------------------------------------------------


def grpc_refusal(name: str) -> str:
    return f"This protocol is restricted, expecting header 'triton-grpc-protocol-{name}'"


@pytest.fixture(scope="module")
def client(server: TritiumProcess) -> Iterator[grpcclient.InferenceServerClient]:
    with grpcclient.InferenceServerClient(server.grpc_url) as grpc_client:
        yield grpc_client


def grpc_inputs(values: list[float]) -> list[grpcclient.InferInput]:
    inputs = [grpcclient.InferInput("INPUT0", [len(values)], "FP32")]
    inputs[0].set_data_from_numpy(np.array(values, dtype=np.float32))
    return inputs


@pytest.mark.parametrize("headers", [None, {"triton-grpc-protocol-infer-key": "k2"},
                                     INFER_KEY, PROBE_KEY])
def test_grpc_restricted_group_refused_without_its_header(
        client: grpcclient.InferenceServerClient, headers: dict[str, str] | None) -> None:
    for attempt in (lambda: client.infer(MODEL, grpc_inputs([1.0]), headers=headers),
                    lambda: client.get_model_config(MODEL, headers=headers)):
        with pytest.raises(InferenceServerException) as refused:
            attempt()
        assert refused.value.status() == "StatusCode.UNAVAILABLE"
        assert refused.value.message() == grpc_refusal("infer-key")


def test_grpc_restricted_group_served_with_its_header(
        client: grpcclient.InferenceServerClient) -> None:
    result = client.infer(MODEL, grpc_inputs([5.0, 6.0]), headers=GRPC_INFER_KEY)
    assert result.as_numpy("OUTPUT0").tolist() == [5.0, 6.0]
    config = client.get_model_config(MODEL, headers=GRPC_INFER_KEY, as_json=True)
    assert config["config"]["name"] == MODEL


def test_grpc_health_group_covers_every_health_method(
        server: TritiumProcess, client: grpcclient.InferenceServerClient) -> None:
    for probe in (client.is_server_live, client.is_server_ready,
                  lambda headers=None: client.is_model_ready(MODEL, headers=headers)):
        with pytest.raises(InferenceServerException, match=grpc_refusal("probe-key")):
            probe()
        assert probe(headers=GRPC_PROBE_KEY) is True
    with grpc.insecure_channel(server.grpc_url) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            health.Check(health_pb2.HealthCheckRequest(), timeout=30)
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
        reply = health.Check(health_pb2.HealthCheckRequest(), timeout=30,
                             metadata=tuple(GRPC_PROBE_KEY.items()))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_grpc_unrestricted_groups_are_served_without_headers(
        client: grpcclient.InferenceServerClient) -> None:
    assert client.get_server_metadata().name == "triton"
    assert client.get_model_metadata(MODEL).name == MODEL
    assert [m.name for m in client.get_model_repository_index().models] == [MODEL]
    assert client.get_inference_statistics(MODEL).model_stats[0].name == MODEL
    assert client.get_log_settings() is not None


def _stream_request() -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name=MODEL, id="s1")
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[1])
    message.raw_input_contents.append(np.array([7], dtype=np.float32).tobytes())
    return message


def test_grpc_restricted_stream_ends_at_once_without_its_header(server: TritiumProcess) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            list(stub.ModelStreamInfer(iter([_stream_request()]), timeout=30))
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
        assert refused.value.details() == grpc_refusal("infer-key")
        replies = list(stub.ModelStreamInfer(iter([_stream_request()]), timeout=30,
                                             metadata=tuple(GRPC_INFER_KEY.items())))
        assert [r.error_message for r in replies] == [""]
        assert replies[0].infer_response.id == "s1"


def test_a_bad_restriction_flag_stops_the_server_in_one_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tritium", "serve", "--model-repository", str(Path.cwd()),
         "--grpc-restricted-protocol", "inference:no-value"],
        capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert errors == ["tritium: error: --grpc-restricted-protocol: expected "
                      "<protocol>[,<protocol>...]:<key>=<value>, got 'inference:no-value'"]
