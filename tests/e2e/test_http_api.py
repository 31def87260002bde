"""The HTTP/REST API through NVIDIA's own client, sync and aio, against a real server."""

from __future__ import annotations

import asyncio
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
from tritonclient.utils import InferenceServerException

from tests.server_process import TritiumProcess
from tests.zoo import ALL_DATATYPES

NUMPY_TYPES: dict[str, Any] = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
    "UINT64": np.uint64, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
    "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
    "BYTES": np.object_, "BF16": ml_dtypes.bfloat16,
}


def sample(datatype: str, count: int = 5) -> np.ndarray:
    if datatype == "BYTES":
        return np.array([f"tok{i}-é".encode() for i in range(count)], dtype=np.object_)
    if datatype == "BOOL":
        return np.array([i % 2 == 0 for i in range(count)], dtype=np.bool_)
    return (np.arange(count) + 1).astype(NUMPY_TYPES[datatype])


@pytest.fixture(scope="module")
def client(server: TritiumProcess) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.http_url)


def test_health_and_server_metadata(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready() is False  # the zoo holds broken models on purpose
    meta = client.get_server_metadata()
    assert meta["name"] == "triton"
    assert "binary_tensor_data" in meta["extensions"]


def test_live_and_ready_have_empty_bodies(server: TritiumProcess) -> None:
    live = requests.get(f"http://{server.http_url}/v2/health/live", timeout=10)
    assert live.status_code == 200 and live.content == b""
    ready = requests.get(f"http://{server.http_url}/v2/health/ready", timeout=10)
    assert ready.status_code == 400 and ready.content == b""


def test_model_metadata_prepends_batch_dim(client: httpclient.InferenceServerClient) -> None:
    meta = client.get_model_metadata("identity_batch")
    assert meta["platform"] == "python"
    assert meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, -1]}]
    two = client.get_model_metadata("add_sub")
    assert two["versions"] == ["1", "2"]
    assert two["inputs"][0]["shape"] == [16]


def test_model_config_is_triton_json(client: httpclient.InferenceServerClient) -> None:
    config = client.get_model_config("add_sub")
    assert config["name"] == "add_sub"
    assert config["input"][0]["dims"] == [16]
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    assert config["instance_group"][0]["count"] == 2


def test_auto_completed_config(client: httpclient.InferenceServerClient) -> None:
    config = client.get_model_config("auto_complete")
    assert config["max_batch_size"] == 4
    assert [i["name"] for i in config["input"]] == ["INPUT0"]
    data = np.array([[1, 2, 3]], dtype=np.int32)
    result = client.infer("auto_complete", [_input("INPUT0", data)])
    assert result.as_numpy("OUTPUT0").tolist() == [[2, 4, 6]]


def test_model_ready_and_repository_index(client: httpclient.InferenceServerClient) -> None:
    assert client.is_model_ready("identity_fp32")
    assert client.is_model_ready("add_sub", "2")
    assert not client.is_model_ready("bad_init")
    assert not client.is_model_ready("no_such_model")
    index = {(row["name"], row.get("version")): row for row in client.get_model_repository_index()}
    assert index[("identity_fp32", "1")]["state"] == "READY"
    assert index[("bad_init", "1")]["state"] == "UNAVAILABLE"
    assert "initialize refuses to start" in index[("bad_init", "1")]["reason"]
    assert index[("bad_config", None)]["state"] == "UNAVAILABLE"
    assert index[("bad_config", None)]["reason"]


def _input(name: str, data: np.ndarray, binary: bool = True) -> httpclient.InferInput:
    bf16 = data.dtype == ml_dtypes.bfloat16
    datatype = "BF16" if bf16 else httpclient.np_to_triton_dtype(data.dtype)
    tensor = httpclient.InferInput(name, list(data.shape), datatype)
    tensor.set_data_from_numpy(data, binary_data=binary)
    return tensor


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("datatype", ALL_DATATYPES)
def test_identity_every_datatype(client: httpclient.InferenceServerClient,
                                 datatype: str, binary: bool) -> None:
    if not binary and datatype in ("FP16", "BF16"):
        pytest.skip("FP16 and BF16 travel only as binary data")
    data = sample(datatype)
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
    result = client.infer(f"identity_{datatype.lower()}", [_input("INPUT0", data, binary)],
                          outputs=[output])
    got = result.as_numpy("OUTPUT0")
    assert got.shape == data.shape
    if datatype == "BF16":
        assert got.astype(np.float32).tolist() == data.astype(np.float32).tolist()
    elif datatype == "BYTES" and not binary:
        # JSON carries strings; the client hands them back as str.
        assert got.tolist() == [item.decode() for item in data]
    else:
        assert got.tolist() == data.tolist()


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_precision_json_input_is_refused(server: TritiumProcess, datatype: str) -> None:
    body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": datatype, "data": [1.0]}]}
    reply = requests.post(f"http://{server.http_url}/v2/models/identity_{datatype.lower()}/infer",
                          json=body, timeout=10)
    assert reply.status_code == 400
    assert "error" in reply.json()


def test_infer_with_versions_and_parameters(client: httpclient.InferenceServerClient) -> None:
    a = np.arange(16, dtype=np.float32)
    b = np.ones(16, dtype=np.float32)
    result = client.infer("add_sub", [_input("INPUT0", a), _input("INPUT1", b)],
                          model_version="1", request_id="req-7")
    response = result.get_response()
    assert response["model_version"] == "1"
    assert response["id"] == "req-7"
    assert response["parameters"]["instance"].startswith("add_sub_0_")
    assert result.as_numpy("OUTPUT0").tolist() == (a + b).tolist()
    assert result.as_numpy("OUTPUT1").tolist() == (a - b).tolist()


def test_requested_outputs_only(client: httpclient.InferenceServerClient) -> None:
    a = np.arange(16, dtype=np.float32)
    result = client.infer("add_sub", [_input("INPUT0", a), _input("INPUT1", a)],
                          outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    assert result.as_numpy("OUTPUT0") is None
    assert result.as_numpy("OUTPUT1").tolist() == [0.0] * 16


def test_batched_identity(client: httpclient.InferenceServerClient) -> None:
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    result = client.infer("identity_batch", [_input("INPUT0", data)])
    assert result.as_numpy("OUTPUT0").tolist() == data.tolist()


@pytest.mark.parametrize(
    ("model", "inputs", "fragment"),
    [
        ("no_such_model", [("INPUT0", np.zeros(1, np.float32))], "unknown model"),
        ("identity_fp32", [("WRONG", np.zeros(1, np.float32))], "unexpected inference input"),
        ("identity_fp32", [("INPUT0", np.zeros(1, np.int32))], "data-type"),
        ("add_sub", [("INPUT0", np.zeros(16, np.float32))],
         "missing required input(s) ['INPUT1']"),
        ("add_sub", [("INPUT0", np.zeros(3, np.float32)),
                     ("INPUT1", np.zeros(3, np.float32))], "unexpected shape"),
        ("identity_batch", [("INPUT0", np.zeros((9, 2), np.float32))], "batch-size"),
    ],
)
def test_invalid_requests_are_400(client: httpclient.InferenceServerClient, model: str,
                                  inputs: list[tuple[str, np.ndarray]], fragment: str) -> None:
    with pytest.raises(InferenceServerException) as caught:
        client.infer(model, [_input(name, data) for name, data in inputs])
    assert caught.value.status() == "400"
    assert fragment in caught.value.message()


def test_model_that_raises_fails_only_that_request(client: httpclient.InferenceServerClient
                                                   ) -> None:
    with pytest.raises(InferenceServerException) as caught:
        client.infer("raises", [_input("INPUT0", np.zeros(1, np.float32))])
    assert caught.value.status() == "500"
    assert "this model always fails" in caught.value.message()
    ok = client.infer("identity_fp32", [_input("INPUT0", np.ones(2, np.float32))])
    assert ok.as_numpy("OUTPUT0").tolist() == [1.0, 1.0]


@pytest.mark.parametrize(("code", "status"), [("INVALID_ARG", "400"), ("UNAVAILABLE", "503"),
                                              ("UNSUPPORTED", "501"), ("INTERNAL", "500"),
                                              ("NOT_FOUND", "404"), ("CANCELLED", "400")])
def test_error_response_codes(client: httpclient.InferenceServerClient, code: str,
                              status: str) -> None:
    data = np.array([code.encode()], dtype=np.object_)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("error_response", [_input("INPUT0", data)])
    assert caught.value.status() == status
    assert f"model refused: {code}" in caught.value.message()


def test_unavailable_model_is_503(client: httpclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as caught:
        client.infer("bad_init", [_input("INPUT0", np.zeros(1, np.float32))])
    assert caught.value.status() == "503"


def test_compressed_request_and_response(client: httpclient.InferenceServerClient) -> None:
    data = np.arange(64, dtype=np.float32)
    for algorithm in ("gzip", "deflate"):
        result = client.infer("identity_fp32", [_input("INPUT0", data)],
                              request_compression_algorithm=algorithm,
                              response_compression_algorithm=algorithm)
        assert result.as_numpy("OUTPUT0").tolist() == data.tolist()


def test_aio_client(server: TritiumProcess) -> None:
    async def scenario() -> None:
        client = aiohttpclient.InferenceServerClient(server.http_url)
        try:
            assert await client.is_server_live()
            assert await client.is_model_ready("identity_fp32")
            meta = await client.get_model_metadata("identity_int64")
            assert meta["inputs"][0]["datatype"] == "INT64"
            data = np.arange(8, dtype=np.int64)
            tensor = aiohttpclient.InferInput("INPUT0", [8], "INT64")
            tensor.set_data_from_numpy(data)
            results = await asyncio.gather(*(
                client.infer("identity_int64", [tensor]) for _ in range(8)
            ))
            assert all(r.as_numpy("OUTPUT0").tolist() == data.tolist() for r in results)
        finally:
            await client.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("path", "method", "status"),
    [("/v2/nothing", "GET", 404), ("/v2/models/identity_fp32/infer", "GET", 405),
     ("/v2/health/live", "POST", 405), ("/v2/models/identity_fp32/versions/x", "GET", 400)],
)
def test_routing_errors(server: TritiumProcess, path: str, method: str, status: int) -> None:
    reply = requests.request(method, f"http://{server.http_url}{path}", timeout=10)
    assert reply.status_code == status
    assert "error" in reply.json()


@pytest.mark.parametrize(
    "body",
    [b"{not json", b"[]", b'{"inputs": 3}', b'{"inputs": [{"name": "INPUT0"}]}',
     b'{"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1]}]}',
     b'{"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": ["x"]}]}',
     b'{"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "NOPE", "data": [1]}]}'],
)
def test_malformed_bodies_are_400_and_server_stays_ready(server: TritiumProcess,
                                                         body: bytes) -> None:
    url = f"http://{server.http_url}/v2/models/identity_fp32/infer"
    reply = requests.post(url, data=body, timeout=10)
    assert reply.status_code == 400
    assert reply.json()["error"]
    assert requests.get(f"http://{server.http_url}/v2/health/live", timeout=10).status_code == 200
