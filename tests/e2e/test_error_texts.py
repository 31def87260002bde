"""Error texts Triton's clients and tests match on, over HTTP and gRPC where both apply."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.server_process import TritiumProcess
from tests.zoo import DECOUPLED, _tensor, add_model

ADD_SUB_IO = (_tensor("input", "INPUT0", "FP32", "16") + _tensor("input", "INPUT1", "FP32", "16")
              + _tensor("output", "OUTPUT0", "FP32", "16")
              + _tensor("output", "OUTPUT1", "FP32", "16"))
BYTES_IO = _tensor("input", "MODE", "BYTES", "1") + _tensor("output", "OUTPUT0", "BYTES", "1")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritiumProcess]:
    repo = tmp_path_factory.mktemp("error_texts")
    add_model(repo, "add_sub", "add_sub", ADD_SUB_IO)
    add_model(repo, "add_sub_optional", "add_sub",
              _tensor("input", "INPUT0", "FP32", "16")
              + _tensor("input", "INPUT1", "FP32", "16", " optional: true")
              + _tensor("output", "OUTPUT0", "FP32", "16")
              + _tensor("output", "OUTPUT1", "FP32", "16"))
    add_model(repo, "repeat", "repeat",
              DECOUPLED + _tensor("input", "INPUT0", "INT32", "1")
              + _tensor("input", "DELAY", "FP32", "1", " optional: true")
              + _tensor("output", "OUTPUT0", "INT32", "1"))
    add_model(repo, "decoupled_returns", "decoupled_returns",
              DECOUPLED + _tensor("input", "INPUT0", "FP32", "1")
              + _tensor("output", "OUTPUT0", "FP32", "1")
              # Group "<model>_0" (Triton names a group it adds itself "<model>").
              + "instance_group [{ count: 1 kind: KIND_CPU }]\n")
    add_model(repo, "bls_errors", "bls_errors", BYTES_IO)
    process = TritiumProcess(repo).start()
    yield process
    assert process.stop() == 0, process.log()


def _client(protocol: str, server: TritiumProcess) -> Any:
    if protocol == "http":
        return httpclient.InferenceServerClient(server.http_url)
    return grpcclient.InferenceServerClient(server.grpc_url)


def _failure(protocol: str, server: TritiumProcess, model: str,
             inputs: dict[str, np.ndarray]) -> str:
    module: Any = httpclient if protocol == "http" else grpcclient
    tensors = []
    for name, data in inputs.items():
        tensor = module.InferInput(name, list(data.shape), module.np_to_triton_dtype(data.dtype))
        tensor.set_data_from_numpy(data)
        tensors.append(tensor)
    with pytest.raises(InferenceServerException) as caught:
        _client(protocol, server).infer(model, tensors)
    return str(caught.value.message())


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_missing_input_names_given_and_missing(server: TritiumProcess, protocol: str) -> None:
    """Triton core (InferenceRequest::ValidateRequestInputs): "[request id: <id>] expected N
    inputs but got M inputs for model 'm'. Got input(s) [...], but missing required input(s)
    [...]. Please provide all required input(s)."; with optional inputs it gives the range."""
    text = _failure(protocol, server, "add_sub", {"INPUT1": np.zeros(16, np.float32)})
    assert text == ("[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model "
                    "'add_sub'. Got input(s) ['INPUT1'], but missing required input(s) "
                    "['INPUT0']. Please provide all required input(s).")
    text = _failure(protocol, server, "add_sub_optional", {"INPUT1": np.zeros(16, np.float32)})
    assert text.endswith("expected number of inputs between 1 and 2 but got 1 inputs for model "
                         "'add_sub_optional'. Got input(s) ['INPUT1'], but missing required "
                         "input(s) ['INPUT0']. Please provide all required input(s).")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_decoupled_return_names_the_instance(server: TritiumProcess, protocol: str) -> None:
    """python_backend's stub, named after the instance (<model>_0_0), fails the requests
    with "Failed to process the request(s) for model '<instance>', message: Python model
    '<instance>' is using the decoupled mode and the execute function must return None."
    (Triton's decoupled_test matches the inner sentence over a gRPC stream)."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, np.float32))
    errors: list[InferenceServerException] = []
    if protocol == "grpc":
        client.start_stream(callback=lambda result, error: errors.append(error))
        client.async_stream_infer("decoupled_returns", [tensor])
        client.stop_stream()
        text = str(errors[0].message())
    else:
        reply = requests.post(f"http://{server.http_url}/v2/models/decoupled_returns/generate",
                              json={"INPUT0": [0.0]}, timeout=30)
        text = reply.json()["error"]
    assert text == ("Failed to process the request(s) for model 'decoupled_returns_0_0', "
                    "message: Python model 'decoupled_returns_0_0' is using the decoupled mode "
                    "and the execute function must return None.")


@pytest.mark.parametrize("count", [0, 2])
def test_generate_needs_exactly_one_response(server: TritiumProcess, count: int) -> None:
    """Triton's HTTP frontend (GenerateRequestClass::SendChunkResponse) answers a
    non-streaming generate whose model sent no or several responses with "generate expects
    model to produce exactly 1 response, use generate stream for model that generates various
    number of responses"."""
    reply = requests.post(f"http://{server.http_url}/v2/models/repeat/generate",
                          json={"INPUT0": count}, timeout=30)
    assert reply.json() == {"error": "generate expects model to produce exactly 1 response, use "
                                     "generate stream for model that generates various number "
                                     "of responses"}


@pytest.mark.parametrize(("mode", "expected"), [
    ("unknown_model", "Model non_existent_model - Error when running inference: Request for "
     "unknown model: 'non_existent_model' is not found"),
    ("unknown_model_decoupled", "Model non_existent_model - Error when running inference: "
     "Request for unknown model: 'non_existent_model' is not found"),
    ("missing_input", "Model add_sub - Error when running inference: [request id: "
     "<id_unknown>] expected 2 inputs but got 1 inputs for model 'add_sub'. Got input(s) "
     "['INPUT0'], but missing required input(s) ['INPUT1']. Please provide all required "
     "input(s)."),
    ("decoupled_child", "Model repeat - Error when running inference: Model repeat is using "
     "the decoupled. The current BLS request call doesn't support models using the decoupled "
     "transaction policy. Please use 'decoupled=True' argument to the 'exec' or 'async_exec' "
     "calls for decoupled models.'"),
])
def test_bls_submission_errors(server: TritiumProcess, mode: str, expected: str) -> None:
    """python_backend's RequestExecutor::Infer: a request the server refuses comes back as a
    response whose error reads "Model <name> - Error when running inference: <reason>"
    (Triton's bls QA model matches "Error when running inference: Request for unknown
    model: 'non_existent_model' is not found")."""
    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("MODE", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([mode.encode()], dtype=np.object_))
    result = client.infer("bls_errors", [tensor]).as_numpy("OUTPUT0")
    assert result is not None
    assert result[0].decode() == expected


def _add_sub_body(parameters: dict[str, Any]) -> dict[str, Any]:
    tensors = [{"name": name, "shape": [16], "datatype": "FP32", "data": [0.0] * 16}
               for name in ("INPUT0", "INPUT1")]
    return {"inputs": tensors, "parameters": parameters}


@pytest.mark.parametrize(("parameters", "expected"), [
    ({"priority": "high"}, "Unable to parse 'priority': attempt to access JSON "
     "non-unsigned-integer as unsigned-integer"),
    ({"sequence_end": "yes"}, "Unable to parse 'sequence_end': attempt to access JSON "
     "non-boolean as boolean"),
    ({"sequence_id": [1]}, "Unable to parse 'sequence_id': attempt to access JSON non-string "
     "as string"),
])
def test_http_parameter_of_the_wrong_type(server: TritiumProcess, parameters: dict[str, Any],
                                          expected: str) -> None:
    """Triton's HTTP frontend (http_server.cc): "Unable to parse '<key>': " and then
    TritonJson's refusal (triton_json.h), as a 400."""
    reply = requests.post(f"http://{server.http_url}/v2/models/add_sub/infer",
                          json=_add_sub_body(parameters), timeout=30)
    assert reply.status_code == 400
    assert reply.json() == {"error": expected}


def test_http_json_field_of_the_wrong_type(server: TritiumProcess) -> None:
    """An "id" that is no string: "Unable to parse 'id': attempt to access JSON non-string as
    string" (ParseJsonTritonRequestID) on /infer and /generate alike."""
    expected = {"error": "Unable to parse 'id': attempt to access JSON non-string as string"}
    body = {**_add_sub_body({}), "id": 7}
    reply = requests.post(f"http://{server.http_url}/v2/models/add_sub/infer", json=body,
                          timeout=30)
    assert (reply.status_code, reply.json()) == (400, expected)
    reply = requests.post(f"http://{server.http_url}/v2/models/repeat/generate",
                          json={"id": 7, "INPUT0": 1}, timeout=30)
    assert (reply.status_code, reply.json()) == (400, expected)


def _grpc_parameter(key: str, **value: Any) -> dict[str, Any]:
    return {key: service_pb2.InferParameter(**value)}


@pytest.mark.parametrize(("parameters", "expected"), [
    (_grpc_parameter("priority", string_param="high"), "invalid value type for 'priority' "
     "parameter, expected int64_param or uint64_param."),
    (_grpc_parameter("priority", int64_param=-1), "invalid value for 'priority', expected "
     "value >= 0."),
    (_grpc_parameter("timeout", bool_param=True), "invalid value type for 'timeout' "
     "parameter, expected int64_param."),
    (_grpc_parameter("sequence_start", int64_param=1), "invalid value type for "
     "'sequence_start' parameter, expected bool_param."),
    (_grpc_parameter("sequence_id", double_param=1.5), "invalid value type for 'sequence_id' "
     "parameter, expected int64_param or string_param."),
])
def test_grpc_parameter_of_the_wrong_type(server: TritiumProcess, parameters: dict[str, Any],
                                          expected: str) -> None:
    """Triton's gRPC frontend (infer_handler.cc SetInferenceRequestMetadata) names the
    InferParameter fields it accepts for each key, as INVALID_ARGUMENT."""
    request = service_pb2.ModelInferRequest(model_name="add_sub", parameters=parameters)
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="FP32", shape=[16])
        request.raw_input_contents.append(np.zeros(16, np.float32).tobytes())
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(request, timeout=30)
    error: Any = caught.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == expected


_INPUT = {"name": "INPUT0", "shape": [16], "datatype": "FP32", "data": [0.0] * 16}


def _without(key: str) -> dict[str, Any]:
    return {k: v for k, v in _INPUT.items() if k != key}


@pytest.mark.parametrize(("body", "expected"), [
    ({}, "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"),
    ({"inputs": {}}, "Unable to parse 'inputs': attempt to access JSON non-array as array"),
    ({"inputs": [_without("name")]},
     "Unable to parse 'name': attempt to access non-existing object member 'name'"),
    ({"inputs": [{**_INPUT, "name": 0}]},
     "Unable to parse 'name': attempt to access JSON non-string as string"),
    ({"inputs": [_without("datatype")]},
     "Unable to parse 'datatype': attempt to access non-existing object member 'datatype'"),
    ({"inputs": [{**_INPUT, "datatype": 11}]},
     "Unable to parse 'datatype': attempt to access JSON non-string as string"),
    ({"inputs": [{**_INPUT, "datatype": "FLOAT32"}]}, "invalid datatype for input INPUT0"),
    ({"inputs": [_without("shape")]},
     "Unable to parse 'shape': attempt to access non-existing object member 'shape'"),
    ({"inputs": [{**_INPUT, "shape": 16}]},
     "Unable to parse 'shape': attempt to access JSON non-array as array"),
    ({"inputs": [{**_INPUT, "shape": [-16]}]},
     "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer"),
    ({"inputs": [{**_INPUT, "data": 0.0}]},
     "Unable to parse 'data': attempt to access JSON non-array as array"),
    ({"inputs": [_INPUT], "outputs": {}},
     "Unable to parse 'outputs': attempt to access JSON non-array as array"),
    ({"inputs": [_INPUT], "outputs": [{"name": 1}]},
     "Unable to parse 'name': attempt to access JSON non-string as string"),
    ({"inputs": [_INPUT], "outputs": [{"name": "OUTPUT0",
                                       "parameters": {"classification": "2"}}]},
     "Unable to set 'classification': attempt to access JSON non-unsigned-integer as "
     "unsigned-integer"),
    ({"inputs": [_INPUT], "parameters": []},
     "failed to get request params.: attempt to get members for non-object"),
    ({"inputs": [_INPUT], "parameters": {"k": [1]}},
     "parameter 'k' has invalid type. It should be either 'int', 'bool', or 'string'."),
    ({"inputs": [7]}, "Input must set only one of the following fields: 'data', "
     "'binary_data_size' in 'parameters', 'shared_memory_region' in 'parameters'. But no "
     "field is set"),
])
def test_http_json_names_shapes_and_types(server: TritiumProcess, body: dict[str, Any],
                                          expected: str) -> None:
    """Triton's HTTP frontend (http_server.cc ParseJsonTritonIO, ParseJsonTritonParams,
    ReadDataFromJson, ValidateInputContentType) words a malformed /infer body as "Unable to
    parse '<field>': " and TritonJson's own refusal (triton_json.h): a member that is absent
    ("attempt to access non-existing object member"), or of the wrong type ("attempt to
    access JSON non-array as array", "... non-string as string", "... non-unsigned-integer as
    unsigned-integer"; output options are "Unable to set ..."); an unknown datatype name is
    "invalid datatype for input <name>"; a
    model parameter that is no scalar is named with 'int', 'bool', or 'string'."""
    reply = requests.post(f"http://{server.http_url}/v2/models/add_sub/infer", json=body,
                          timeout=30)
    assert (reply.status_code, reply.json()) == (400, {"error": expected})


def test_http_reserved_parameter_prefix(server: TritiumProcess) -> None:
    """ParseJsonTritonParams refuses every key starting with "triton_": "parameter keys
    starting with 'triton_' are reserved for Triton usage and should not be specified."."""
    reply = requests.post(f"http://{server.http_url}/v2/models/add_sub/infer",
                          json=_add_sub_body({"triton_x": 1}), timeout=30)
    assert (reply.status_code, reply.json()) == (400, {"error": (
        "parameter keys starting with 'triton_' are reserved for Triton usage and should not "
        "be specified.")})


@pytest.mark.parametrize(("parameters", "expected"), [
    (_grpc_parameter("triton_x", bool_param=True), "parameter keys starting with 'triton_' "
     "are reserved for Triton usage. Only the following keys starting with 'triton_' are "
     "allowed: triton_enable_empty_final_response"),
    (_grpc_parameter("k", uint64_param=1), "invalid value type for 'k' parameter, expected "
     "int64_param, bool_param, or string_param."),
    (_grpc_parameter("k"), "invalid value type for 'k' parameter, expected int64_param, "
     "bool_param, or string_param."),
])
def test_grpc_model_parameter_refusals(server: TritiumProcess, parameters: dict[str, Any],
                                       expected: str) -> None:
    """SetInferenceRequestMetadata (grpc/infer_handler.cc): a "triton_" key it does not know
    is refused naming the ones it does (TRITON_RESERVED_REQUEST_PARAMS, common.h); a model
    parameter must be int64, bool, string (or double) valued."""
    test_grpc_parameter_of_the_wrong_type(server, parameters, expected)


@pytest.mark.parametrize("endpoint", ["generate", "generate_stream"])
@pytest.mark.parametrize(("model", "body", "expected"), [
    ("bls_errors", {"MODE": 123}, "attempt to access JSON non-string as string"),
    ("bls_errors", {"MODE": {"USER": "hello", "BOT": "world"}},
     "attempt to access JSON non-string as string"),
    ("add_sub", {"INPUT0": ["1"] * 16, "INPUT1": [1.0] * 16},
     "attempt to access JSON non-number as double"),
])
def test_generate_value_of_the_wrong_json_type(server: TritiumProcess, endpoint: str,
                                               model: str, body: dict[str, Any],
                                               expected: str) -> None:
    """Triton's generate_endpoint_test (test_invalid_input_types, test_complex_schema)
    matches TritonJson's words for a value of the wrong JSON type."""
    reply = requests.post(f"http://{server.http_url}/v2/models/{model}/{endpoint}",
                          json=body, timeout=30)
    assert reply.status_code == 400
    assert reply.headers["Content-Type"] == "application/json"
    assert expected in reply.json()["error"]
