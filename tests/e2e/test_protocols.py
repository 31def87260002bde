"""Behaviour that exists on both protocols, exercised by one test body over HTTP and gRPC."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.server_process import TritiumProcess
from tests.zoo import ALL_DATATYPES

# Core error code -> (HTTP status, gRPC status) as each client reports it.
STATUS = {
    "INVALID_ARG": ("400", "StatusCode.INVALID_ARGUMENT"),
    "UNAVAILABLE": ("503", "StatusCode.UNAVAILABLE"),
    "UNSUPPORTED": ("501", "StatusCode.UNIMPLEMENTED"),
    "INTERNAL": ("500", "StatusCode.INTERNAL"),
    "NOT_FOUND": ("404", "StatusCode.NOT_FOUND"),
    "CANCELLED": ("400", "StatusCode.CANCELLED"),
}


class Client:
    """tritonclient.http or tritonclient.grpc behind one small interface."""

    def __init__(self, protocol: str, server: TritiumProcess):
        self.protocol = protocol
        self.module: Any = httpclient if protocol == "http" else grpcclient
        url = server.http_url if protocol == "http" else server.grpc_url
        self.raw = self.module.InferenceServerClient(url)

    def status(self, code: str) -> str:
        return STATUS[code][0 if self.protocol == "http" else 1]

    def infer(self, model: str, inputs: dict[str, np.ndarray], **options: Any
              ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        tensors = []
        for name, data in inputs.items():
            bf16 = data.dtype == ml_dtypes.bfloat16
            datatype = "BF16" if bf16 else self.module.np_to_triton_dtype(data.dtype)
            tensor = self.module.InferInput(name, list(data.shape), datatype)
            tensor.set_data_from_numpy(data)
            tensors.append(tensor)
        result = self.raw.infer(model, tensors, **options)
        response = result.get_response() if self.protocol == "http" else \
            result.get_response(as_json=True)
        outputs = {o["name"]: result.as_numpy(o["name"]) for o in response["outputs"]}
        return outputs, response

    def json(self, method: str, *args: Any) -> Any:
        call = getattr(self.raw, method)
        return call(*args) if self.protocol == "http" else call(*args, as_json=True)

    def failure(self, call: Callable[[], Any]) -> InferenceServerException:
        with pytest.raises(InferenceServerException) as caught:
            call()
        return caught.value


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, server: TritiumProcess) -> Iterator[Client]:
    wrapped = Client(request.param, server)
    yield wrapped
    wrapped.raw.close()


def sample(datatype: str) -> np.ndarray:
    if datatype == "BYTES":
        return np.array([b"alpha", "βeta".encode(), b""], dtype=np.object_)
    if datatype == "BOOL":
        return np.array([True, False, True])
    numpy_type = ml_dtypes.bfloat16 if datatype == "BF16" else np.dtype(datatype.lower().replace(
        "fp", "float"))
    return (np.arange(3) + 1).astype(numpy_type)


@pytest.mark.parametrize("datatype", ALL_DATATYPES)
def test_identity_round_trips_every_datatype(client: Client, datatype: str) -> None:
    data = sample(datatype)
    outputs, response = client.infer(f"identity_{datatype.lower()}", {"INPUT0": data})
    assert response["model_name"] == f"identity_{datatype.lower()}"
    got = outputs["OUTPUT0"]
    assert got.shape == data.shape
    if datatype == "BF16":
        assert got.astype(np.float32).tolist() == data.astype(np.float32).tolist()
    else:
        assert got.tolist() == data.tolist()


def test_version_id_and_response_parameters(client: Client) -> None:
    a, b = np.arange(16, dtype=np.float32), np.full(16, 2, dtype=np.float32)
    outputs, response = client.infer("add_sub", {"INPUT0": a, "INPUT1": b}, model_version="1",
                                     request_id="both-1")
    assert response["model_version"] == "1"
    assert response["id"] == "both-1"
    instance = response["parameters"]["instance"]
    instance = instance if isinstance(instance, str) else instance["string_param"]
    assert instance.startswith("add_sub_0_")
    assert outputs["OUTPUT0"].tolist() == (a + b).tolist()
    assert outputs["OUTPUT1"].tolist() == (a - b).tolist()


def test_metadata_and_config(client: Client) -> None:
    meta = client.json("get_model_metadata", "identity_batch")
    assert meta["platform"] == "python"
    assert [int(d) for d in meta["inputs"][0]["shape"]] == [-1, -1]
    assert meta["inputs"][0]["datatype"] == "FP32"
    config = client.json("get_model_config", "add_sub")
    config = config.get("config", config)
    assert [int(d) for d in config["input"][0]["dims"]] == [16]
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    server = client.json("get_server_metadata")
    assert server["name"] == "triton"
    assert "statistics" in server["extensions"]


def test_readiness_and_repository_index(client: Client) -> None:
    assert client.raw.is_server_live()
    assert not client.raw.is_server_ready()  # the zoo holds broken models on purpose
    assert client.raw.is_model_ready("identity_fp32")
    assert not client.raw.is_model_ready("bad_init")
    index = client.json("get_model_repository_index")
    rows = index if isinstance(index, list) else index["models"]
    states = {(row["name"], row.get("version")): row for row in rows}
    assert states[("identity_fp32", "1")]["state"] == "READY"
    assert states[("bad_init", "1")]["state"] == "UNAVAILABLE"
    assert "initialize refuses to start" in states[("bad_init", "1")]["reason"]


@pytest.mark.parametrize("code", list(STATUS))
def test_model_error_codes_map_to_protocol_statuses(client: Client, code: str) -> None:
    error = client.failure(lambda: client.infer(
        "error_response", {"INPUT0": np.array([code.encode()], dtype=np.object_)}))
    assert error.status() == client.status(code)
    assert f"model refused: {code}" in error.message()


@pytest.mark.parametrize(
    ("model", "inputs", "code", "fragment"),
    [
        ("no_such_model", {"INPUT0": np.zeros(1, np.float32)}, "INVALID_ARG", "unknown model"),
        ("identity_fp32", {"INPUT0": np.zeros(1, np.int32)}, "INVALID_ARG", "data-type"),
        ("add_sub", {"INPUT0": np.zeros(16, np.float32)}, "INVALID_ARG",
         "missing required input(s) ['INPUT1']"),
        ("bad_init", {"INPUT0": np.zeros(1, np.float32)}, "UNAVAILABLE", "bad_init"),
        ("repeat", {"INPUT0": np.array([1], np.int32)}, "UNSUPPORTED", "decoupled"),
    ],
)
def test_requests_the_core_refuses(client: Client, model: str, inputs: dict[str, np.ndarray],
                                   code: str, fragment: str) -> None:
    error = client.failure(lambda: client.infer(model, inputs))
    assert error.status() == client.status(code)
    assert fragment in error.message()


def test_model_that_raises_fails_only_its_request(client: Client) -> None:
    error = client.failure(lambda: client.infer("raises", {"INPUT0": np.zeros(1, np.float32)}))
    assert error.status() == client.status("INTERNAL")
    assert "this model always fails" in error.message()
    outputs, _ = client.infer("identity_fp32", {"INPUT0": np.ones(2, np.float32)})
    assert outputs["OUTPUT0"].tolist() == [1.0, 1.0]


def test_statistics_of_one_model(client: Client) -> None:
    client.infer("identity_int8", {"INPUT0": np.ones(2, np.int8)})
    stats = client.json("get_inference_statistics", "identity_int8")["model_stats"]
    assert [s["name"] for s in stats] == ["identity_int8"]
    assert int(stats[0]["inference_stats"]["success"]["count"]) >= 1
    assert int(stats[0]["execution_count"]) >= 1
    # perf_analyzer refuses statistics whose three compute counts differ.
    counts = {int(stats[0]["inference_stats"][part]["count"])
              for part in ("compute_input", "compute_infer", "compute_output")}
    assert len(counts) == 1
