"""The KServe v2 gRPC API against a real server: health, metadata, repository, unary infer."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.server_process import TritiumProcess
from tests.zoo import ALL_DATATYPES

TYPED_FIELDS = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
    "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
    "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


@pytest.fixture(scope="module")
def client(server: TritiumProcess) -> Iterator[grpcclient.InferenceServerClient]:
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        yield c


@pytest.fixture(scope="module")
def stub(server: TritiumProcess) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def values(datatype: str) -> np.ndarray:
    if datatype == "BYTES":
        return np.array([b"a", b"\x00\xffz", b""], dtype=object)
    if datatype == "BOOL":
        return np.array([True, False, True])
    if datatype == "BF16":
        return np.array([0x3F80, 0x4000, 0xBF80], dtype=np.uint16)  # bfloat16 bit patterns
    return np.array([1, 2, 3], dtype=grpcclient.triton_to_np_dtype(datatype))


def fp32_input(data: list[float], name: str = "INPUT0") -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, [len(data)], "FP32")
    tensor.set_data_from_numpy(np.array(data, dtype=np.float32))
    return tensor


def status_of(call: object) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()  # type: ignore[operator]
    return info.value


# ------------------------------------------------------------- health, metadata


def test_health(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_model_ready("identity_fp32")
    assert client.is_model_ready("add_sub", "2")
    assert not client.is_model_ready("no_such_model")
    assert not client.is_model_ready("bad_init")


def test_standard_health_service(server: TritiumProcess,
                                 client: grpcclient.InferenceServerClient) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        reply = health.Check(health_pb2.HealthCheckRequest(), timeout=10)
        # The zoo holds models that fail to load on purpose, so the server may be not ready.
        serving = reply.status == health_pb2.HealthCheckResponse.SERVING
        assert serving is client.is_server_ready()
        with pytest.raises(grpc.RpcError) as info:
            health.Check(health_pb2.HealthCheckRequest(service="other"), timeout=10)
        assert info.value.code() is grpc.StatusCode.NOT_FOUND


def test_server_and_model_metadata(client: grpcclient.InferenceServerClient) -> None:
    server = client.get_server_metadata()
    assert server.name == "triton" and server.version
    assert "model_repository" in server.extensions
    assert not any("shared_memory" in e for e in server.extensions)
    meta = client.get_model_metadata("identity_batch")
    assert (meta.name, list(meta.versions), meta.platform) == ("identity_batch", ["1"], "python")
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
        ("INPUT0", "FP32", [-1, -1])]
    assert sorted(client.get_model_metadata("add_sub").versions) == ["1", "2"]
    assert list(client.get_model_metadata("add_sub", "2").versions) == ["2"]
    # An unknown model is INVALID_ARG in Triton's core, so INVALID_ARGUMENT here.
    error = status_of(lambda: client.get_model_metadata("no_such_model"))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "unknown model" in (error.message() or "")
    error = status_of(lambda: client.get_model_metadata("add_sub", "x"))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"


def test_model_config(client: grpcclient.InferenceServerClient) -> None:
    config = client.get_model_config("identity_batch").config
    assert config.name == "identity_batch" and config.max_batch_size == 8
    assert config.input[0].name == "INPUT0"
    assert client.get_model_config("add_sub").config.instance_group[0].count == 2
    error = status_of(lambda: client.get_model_config("nope"))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"


def test_repository_index_and_control(client: grpcclient.InferenceServerClient) -> None:
    index = client.get_model_repository_index()
    rows = {(m.name, m.version): m for m in index.models}
    assert rows[("identity_fp32", "1")].state == "READY"
    assert rows[("bad_init", "1")].state == "UNAVAILABLE"
    assert "initialize refuses" in rows[("bad_init", "1")].reason
    # Load and unload are the core's decision; in this mode it refuses with UNAVAILABLE.
    for call in (lambda: client.load_model("identity_fp32"),
                 lambda: client.unload_model("identity_fp32")):
        error = status_of(call)
        assert error.status() == "StatusCode.UNAVAILABLE"
        assert "model-control-mode" in (error.message() or "")


def test_model_statistics(client: grpcclient.InferenceServerClient) -> None:
    tensor = grpcclient.InferInput("INPUT0", [1], "INT16")
    tensor.set_data_from_numpy(np.array([7], dtype=np.int16))
    before = client.get_inference_statistics("identity_int16").model_stats[0]
    client.infer("identity_int16", [tensor])
    stats = client.get_inference_statistics("identity_int16", "1").model_stats
    assert [(s.name, s.version) for s in stats] == [("identity_int16", "1")]
    assert stats[0].inference_count == before.inference_count + 1
    assert stats[0].inference_stats.success.count == before.inference_stats.success.count + 1
    every = {s.name for s in client.get_inference_statistics().model_stats}
    assert {"identity_int16", "slow"} <= every
    error = status_of(lambda: client.get_inference_statistics("no_such_model"))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"


def test_client_shared_memory_is_off_by_default(
        client: grpcclient.InferenceServerClient) -> None:
    """As Triton 2.73 without --allow-client-shm: status lists no region, and registering
    or unregistering is UNIMPLEMENTED with its text naming the flag."""
    assert not client.get_system_shared_memory_status(as_json=True)
    for call in (lambda: client.register_system_shared_memory("r", "/k", 16),
                 client.unregister_system_shared_memory,
                 client.unregister_cuda_shared_memory):
        error = status_of(call)
        assert error.status() == "StatusCode.UNIMPLEMENTED"
        assert "--allow-client-shm=true" in (error.message() or "")


def test_log_and_trace_settings(client: grpcclient.InferenceServerClient) -> None:
    settings = client.get_log_settings(as_json=True)["settings"]
    assert settings["log_info"] == {"bool_param": True}
    updated = client.update_log_settings({"log_verbose_level": 1}, as_json=True)
    assert updated["settings"]["log_verbose_level"] == {"uint32_param": 1}
    client.update_log_settings({"log_verbose_level": 0})
    error = status_of(lambda: client.update_log_settings({"no_such_setting": True}))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    trace = client.get_trace_settings(as_json=True)["settings"]
    assert trace["trace_level"] == {"value": ["OFF"]}
    error = status_of(
        lambda: client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]}))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"  # no trace file was given


# ----------------------------------------------------------------- unary infer


@pytest.mark.parametrize("datatype", ALL_DATATYPES)
def test_infer_every_datatype_raw(client: grpcclient.InferenceServerClient, datatype: str) -> None:
    data = values(datatype)
    tensor = grpcclient.InferInput("INPUT0", [3], datatype)
    if datatype == "BF16":
        # The client refuses non-float arrays for BF16; send the raw 16-bit patterns.
        tensor._raw_content = data.tobytes()
    else:
        tensor.set_data_from_numpy(data)
    result = client.infer(f"identity_{datatype.lower()}", [tensor], request_id=f"raw-{datatype}")
    response = result.get_response()
    assert (response.id, response.model_version) == (f"raw-{datatype}", "1")
    assert response.outputs[0].datatype == datatype
    assert list(response.outputs[0].shape) == [3]
    if datatype == "BF16":
        assert response.raw_output_contents[0] == data.tobytes()
    else:
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


@pytest.mark.parametrize("datatype", sorted(TYPED_FIELDS))
def test_infer_every_datatype_typed(stub: service_pb2_grpc.GRPCInferenceServiceStub,
                                    datatype: str) -> None:
    data = values(datatype)
    message = pb.ModelInferRequest(model_name=f"identity_{datatype.lower()}", id="typed")
    item = message.inputs.add(name="INPUT0", datatype=datatype, shape=[3])
    getattr(item.contents, TYPED_FIELDS[datatype]).extend(data.tolist())
    response = stub.ModelInfer(message, timeout=30)
    assert response.id == "typed" and not response.outputs[0].HasField("contents")
    raw = response.raw_output_contents[0]
    if datatype == "BYTES":
        assert raw == b"".join(len(e).to_bytes(4, "little") + e for e in data.tolist())
    else:
        np.testing.assert_array_equal(np.frombuffer(raw, dtype=data.dtype), data)


def test_mixed_raw_and_typed_is_invalid(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    message = pb.ModelInferRequest(model_name="identity_fp32")
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[1]).contents.fp32_contents.append(1)
    message.raw_input_contents.append(np.float32(1).tobytes())
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(message, timeout=30)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT


def test_reserved_parameter_is_invalid(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    # tritonclient refuses triton_* keys itself, so the message is built by hand.
    message = pb.ModelInferRequest(model_name="identity_fp32")
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[1])
    message.raw_input_contents.append(np.float32(1).tobytes())
    message.parameters["triton_x"].bool_param = True
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(message, timeout=30)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    # Triton names the keys it allows, not the one it refuses (grpc/infer_handler.cc).
    assert info.value.details() == (
        "parameter keys starting with 'triton_' are reserved for Triton usage. Only the "
        "following keys starting with 'triton_' are allowed: triton_enable_empty_final_response")


def test_infer_batched_requested_outputs_and_parameters(
        client: grpcclient.InferenceServerClient) -> None:
    a, b = np.arange(16, dtype=np.float32), np.ones(16, dtype=np.float32)
    inputs = [fp32_input(a.tolist(), "INPUT0"), fp32_input(b.tolist(), "INPUT1")]
    outputs = [grpcclient.InferRequestedOutput("OUTPUT1")]
    result = client.infer("add_sub", inputs, model_version="2", outputs=outputs,
                          parameters={"custom": "x"}, priority=1, timeout=10_000_000)
    response = result.get_response()
    assert [o.name for o in response.outputs] == ["OUTPUT1"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert response.parameters["instance"].string_param.startswith("add_sub")
    batch = grpcclient.InferInput("INPUT0", [2, 3], "FP32")
    batch.set_data_from_numpy(np.ones((2, 3), dtype=np.float32))
    assert client.infer("identity_batch", [batch]).as_numpy("OUTPUT0").shape == (2, 3)


def test_infer_errors(client: grpcclient.InferenceServerClient) -> None:
    cases = [
        (lambda: client.infer("no_such_model", [fp32_input([1])]), "INVALID_ARGUMENT"),
        (lambda: client.infer("identity_int32", [fp32_input([1])]), "INVALID_ARGUMENT"),
        (lambda: client.infer("raises", [fp32_input([1])]), "INTERNAL"),
    ]
    for call, code in cases:
        assert status_of(call).status() == f"StatusCode.{code}"


@pytest.mark.parametrize("code, status", [
    ("INVALID_ARG", "INVALID_ARGUMENT"), ("UNSUPPORTED", "UNIMPLEMENTED"),
    ("UNAVAILABLE", "UNAVAILABLE"), ("NOT_FOUND", "NOT_FOUND"), ("INTERNAL", "INTERNAL"),
    ("UNKNOWN", "UNKNOWN"), ("ALREADY_EXISTS", "ALREADY_EXISTS"), ("CANCELLED", "CANCELLED"),
])
def test_model_error_codes(client: grpcclient.InferenceServerClient, code: str,
                           status: str) -> None:
    tensor = grpcclient.InferInput("INPUT0", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([code.encode()], dtype=object))
    error = status_of(lambda: client.infer("error_response", [tensor]))
    assert error.status() == f"StatusCode.{status}"
    assert f"model refused: {code}" in (error.message() or "")


def test_decoupled_model_is_refused_on_model_infer(
        client: grpcclient.InferenceServerClient) -> None:
    count = grpcclient.InferInput("INPUT0", [1], "INT32")
    count.set_data_from_numpy(np.array([2], dtype=np.int32))
    error = status_of(lambda: client.infer("repeat", [count]))
    assert error.status() == "StatusCode.UNIMPLEMENTED"
    assert "decoupled" in (error.message() or "")


def test_large_message(client: grpcclient.InferenceServerClient) -> None:
    data = np.random.default_rng(0).random(5 * 1024 * 1024, dtype=np.float32)  # 20 MiB
    tensor = grpcclient.InferInput("INPUT0", [data.size], "FP32")
    tensor.set_data_from_numpy(data)
    np.testing.assert_array_equal(client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0"), data)


def test_aio_client(server: TritiumProcess) -> None:
    async def run() -> None:
        async with aioclient.InferenceServerClient(server.grpc_url) as c:
            assert await c.is_server_live()
            assert await c.is_model_ready("identity_fp32")
            meta = await c.get_model_metadata("identity_bytes")
            assert meta.inputs[0].datatype == "BYTES"
            tensors = []
            for datatype in ("FP32", "BYTES", "INT64", "BOOL"):
                tensor = aioclient.InferInput("INPUT0", [3], datatype)
                tensor.set_data_from_numpy(values(datatype))
                tensors.append((datatype, tensor))
            results = await asyncio.gather(*(
                c.infer(f"identity_{d.lower()}", [t], request_id=d) for d, t in tensors))
            for (datatype, _), result in zip(tensors, results, strict=True):
                assert result.get_response().id == datatype
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values(datatype))
            with pytest.raises(InferenceServerException) as info:
                await c.infer("raises", [fp32_input([1])])
            assert info.value.status() == "StatusCode.INTERNAL"

    asyncio.run(run())


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_client_compressed_requests(client: grpcclient.InferenceServerClient,
                                    algorithm: str) -> None:
    # A large, compressible tensor so grpc really compresses it (it skips tiny messages).
    data = np.zeros(256 * 1024, dtype=np.float32)
    data[::7] = 3.0
    tensor = grpcclient.InferInput("INPUT0", [data.size], "FP32")
    tensor.set_data_from_numpy(data)
    result = client.infer("identity_fp32", [tensor], compression_algorithm=algorithm)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)



def test_cuda_shared_memory_registration_is_not_supported(
        client: grpcclient.InferenceServerClient) -> None:
    """Triton's gRPC CudaSharedMemoryRegister built without GPUs refuses before it looks at
    --allow-client-shm: INVALID_ARGUMENT "failed to register CUDA shared memory region:
    '<name>', GPUs not supported"; status lists no region."""
    error = status_of(lambda: client.register_cuda_shared_memory("gpu", b"\0" * 64, 0, 64))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert error.message() == ("failed to register CUDA shared memory region: 'gpu', GPUs not "
                               "supported")
    assert client.get_cuda_shared_memory_status(as_json=True) == {}
