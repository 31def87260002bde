"""System shared memory end to end, as tritonclient's ``shared_memory`` utilities use it over
HTTP and gRPC: register, infer with inputs and outputs in regions, status, unregister, and
every refusal in Triton's words (server src/shared_memory_manager.cc, http_server.cc,
grpc/infer_handler.cc)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from tests.server_process import TritiumProcess
from tests.zoo import _tensor, add_model

PROTOCOLS = ["http", "grpc"]
VECTOR = 16 * 4  # one FP32 [16] tensor, in bytes


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritiumProcess]:
    repo = tmp_path_factory.mktemp("shared_memory")
    add_model(repo, "add_sub", "add_sub",
              _tensor("input", "INPUT0", "FP32", "16") + _tensor("input", "INPUT1", "FP32", "16")
              + _tensor("output", "OUTPUT0", "FP32", "16")
              + _tensor("output", "OUTPUT1", "FP32", "16"))
    add_model(repo, "identity_bytes", "identity",
              _tensor("input", "INPUT0", "BYTES", "-1")
              + _tensor("output", "OUTPUT0", "BYTES", "-1"))
    process = TritiumProcess(repo, "--allow-client-shm=true").start()
    yield process
    assert process.stop() == 0, process.log()


class Regions:
    """Regions a test made (each with a fresh key) and registered; all gone afterwards."""

    def __init__(self, protocol: str, server: TritiumProcess):
        self.module: Any = httpclient if protocol == "http" else grpcclient
        self.client: Any = self.module.InferenceServerClient(
            server.http_url if protocol == "http" else server.grpc_url)
        self.handles: list[Any] = []

    def make(self, name: str, size: int, register: bool = True) -> tuple[Any, str]:
        key = f"/tritium_e2e_{uuid.uuid4().hex}"
        handle = shm.create_shared_memory_region(name, key, size)
        self.handles.append(handle)
        if register:
            self.client.register_system_shared_memory(name, key, size)
        return handle, key

    def close(self) -> None:
        self.client.unregister_system_shared_memory()
        for handle in self.handles:
            shm.destroy_shared_memory_region(handle)


@pytest.fixture(params=PROTOCOLS)
def regions(request: pytest.FixtureRequest, server: TritiumProcess) -> Iterator[Regions]:
    made = Regions(request.param, server)
    yield made
    made.close()


def add_sub_request(regions: Regions, in_name: str, out_name: str | None,
                    out_size: int = VECTOR) -> tuple[list[Any], list[Any]]:
    """INPUT0 at offset 0 and INPUT1 at VECTOR of ``in_name``; the outputs likewise in
    ``out_name`` (None: in the response)."""
    module = regions.module
    inputs = [module.InferInput(name, [16], "FP32") for name in ("INPUT0", "INPUT1")]
    inputs[0].set_shared_memory(in_name, VECTOR)
    inputs[1].set_shared_memory(in_name, VECTOR, offset=VECTOR)
    outputs = [module.InferRequestedOutput(name) for name in ("OUTPUT0", "OUTPUT1")]
    if out_name is not None:
        outputs[0].set_shared_memory(out_name, out_size)
        outputs[1].set_shared_memory(out_name, out_size, offset=VECTOR)
    return inputs, outputs


def failure(call: Any, *args: Any, **kwargs: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call(*args, **kwargs)
    return caught.value


def status_names(regions: Regions) -> dict[str, dict[str, Any]]:
    if regions.module is httpclient:
        return {entry["name"]: entry for entry in regions.client.get_system_shared_memory_status()}
    # gRPC, as protobuf JSON: zeros left out, int64 as text.
    status = regions.client.get_system_shared_memory_status(as_json=True)
    return {name: {"name": s["name"], "key": s["key"], "offset": int(s.get("offset", 0)),
                   "byte_size": int(s.get("byte_size", 0))}
            for name, s in status.get("regions", {}).items()}


# ------------------------------------------------------------------------- working


def test_inputs_and_outputs_in_shared_memory(regions: Regions) -> None:
    """simple_*_shm_client.py's flow: both inputs in one region, both outputs in another;
    the response lists the outputs without data, their values are in the region."""
    a, b = np.arange(16, dtype=np.float32), np.full(16, 2, dtype=np.float32)
    inputs_handle, inputs_key = regions.make("inputs", 2 * VECTOR)
    outputs_handle, _ = regions.make("outputs", 2 * VECTOR)
    shm.set_shared_memory_region(inputs_handle, [a, b])
    assert status_names(regions)["inputs"] == {
        "name": "inputs", "key": inputs_key, "offset": 0, "byte_size": 2 * VECTOR}

    inputs, outputs = add_sub_request(regions, "inputs", "outputs")
    result = regions.client.infer("add_sub", inputs, outputs=outputs)
    if regions.module is grpcclient:  # each output has an empty raw entry, as in Triton
        assert list(result.get_response().raw_output_contents) == [b"", b""]
    for name, expected, offset in (("OUTPUT0", a + b, 0), ("OUTPUT1", a - b, VECTOR)):
        described = result.get_output(name)
        if isinstance(described, dict):  # HTTP: no data and no binary_data_size
            assert described == {"name": name, "datatype": "FP32", "shape": [16]}
        else:
            assert (described.datatype, list(described.shape)) == ("FP32", [16])
        got = shm.get_contents_as_numpy(outputs_handle, np.float32, [16], offset=offset)
        np.testing.assert_array_equal(got, expected)

    regions.client.unregister_system_shared_memory("inputs")
    assert set(status_names(regions)) == {"outputs"}


def test_inputs_in_shared_memory_outputs_in_the_response(regions: Regions) -> None:
    handle, _ = regions.make("inputs", 2 * VECTOR)
    a = np.linspace(0, 1, 16, dtype=np.float32)
    shm.set_shared_memory_region(handle, [a, a])
    inputs, outputs = add_sub_request(regions, "inputs", None)
    result = regions.client.infer("add_sub", inputs, outputs=outputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)


def test_bytes_tensors_through_shared_memory(regions: Regions) -> None:
    """BYTES travel in the binary layout (4-byte length, then the bytes) both ways."""
    values = np.array([b"shared", b"", b"memory"], dtype=np.object_)
    serialized = serialize_byte_tensor(values)  # one object: the serialized bytes
    size = len(serialized.item())
    in_handle, _ = regions.make("in_bytes", size)
    out_handle, _ = regions.make("out_bytes", 64)
    shm.set_shared_memory_region(in_handle, [serialized])
    tensor = regions.module.InferInput("INPUT0", [3], "BYTES")
    tensor.set_shared_memory("in_bytes", size)
    output = regions.module.InferRequestedOutput("OUTPUT0")
    output.set_shared_memory("out_bytes", 64)
    regions.client.infer("identity_bytes", [tensor], outputs=[output])
    got = shm.get_contents_as_numpy(out_handle, np.object_, [3])
    assert got.tolist() == values.tolist()


def test_register_offset_is_where_the_region_starts(regions: Regions) -> None:
    """A region registered at an offset into its object: tensor offsets count from there."""
    key = f"/tritium_e2e_{uuid.uuid4().hex}"
    handle = shm.create_shared_memory_region("big", key, 4096 + 2 * VECTOR)
    regions.handles.append(handle)
    a = np.arange(16, dtype=np.float32)
    shm.set_shared_memory_region(handle, [a, a], offset=4096)
    regions.client.register_system_shared_memory("big", key, 2 * VECTOR, offset=4096)
    inputs, outputs = add_sub_request(regions, "big", None)
    result = regions.client.infer("add_sub", inputs, outputs=outputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros(16, np.float32))


def test_server_lists_the_extension(regions: Regions) -> None:
    metadata = regions.client.get_server_metadata()
    extensions = metadata["extensions"] if isinstance(metadata, dict) else metadata.extensions
    assert "system_shared_memory" in extensions and "cuda_shared_memory" not in extensions


def test_unregister_releases_the_object(regions: Regions, server: TritiumProcess) -> None:
    """Unregistering closes the server's descriptor on the object, all at once too."""
    _, key = regions.make("one", VECTOR)
    _, other = regions.make("two", VECTOR)
    assert open_keys(server) == {key, other}
    regions.client.unregister_system_shared_memory("one")
    assert open_keys(server) == {other}
    regions.client.unregister_system_shared_memory()
    assert open_keys(server) == set() and status_names(regions) == {}


def open_keys(server: TritiumProcess) -> set[str]:
    keys = set()
    for fd in os.listdir(f"/proc/{server.pid}/fd"):
        try:
            target = os.readlink(f"/proc/{server.pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/dev/shm/tritium_e2e_"):
            keys.add(target[len("/dev/shm"):])
    return keys


# -------------------------------------------------------------------------- refused


def test_registration_refusals(regions: Regions) -> None:
    """Triton's texts: a name registered twice, an object that does not exist, a range past
    its end, a reserved key, and status of a name not registered."""
    _, key = regions.make("taken", VECTOR)
    cases = [
        (("taken", key, VECTOR), "shared memory region 'taken' already in manager"),
        (("x", "/tritium_e2e_absent", 8), "Unable to open shared memory region: "
         "'/tritium_e2e_absent'"),
        (("x", key, 2 * VECTOR), "failed to register shared memory region 'x': invalid args"),
        (("x", "/triton_python_backend_shm_region_1", 8),
         "cannot register shared memory region 'x' with key "
         "'/triton_python_backend_shm_region_1' as the key contains the reserved prefix "
         "'triton_python_backend_shm_region_'"),
    ]
    for args, text in cases:
        assert failure(regions.client.register_system_shared_memory, *args).message() == text
    error = failure(regions.client.get_system_shared_memory_status, "nope")
    assert error.message() == "Unable to find system shared memory region: 'nope'"


def test_inference_refusals(regions: Regions) -> None:
    """GetMemoryInfo's texts for an unknown region, an offset past the region, a range
    past it; and an output region too small for the result."""
    handle, _ = regions.make("inputs", 2 * VECTOR)
    regions.make("small", 8)
    shm.set_shared_memory_region(handle, [np.zeros(32, np.float32)])
    client, module = regions.client, regions.module

    inputs, outputs = add_sub_request(regions, "missing", None)
    assert failure(client.infer, "add_sub", inputs, outputs=outputs).message() == (
        "Unable to find shared memory region: 'missing'")
    inputs, outputs = add_sub_request(regions, "inputs", None)
    inputs[1].set_shared_memory("inputs", VECTOR, offset=2 * VECTOR)
    assert failure(client.infer, "add_sub", inputs, outputs=outputs).message() == (
        "Invalid offset for shared memory region: 'inputs'")
    inputs[1].set_shared_memory("inputs", VECTOR + 4, offset=VECTOR)
    assert failure(client.infer, "add_sub", inputs, outputs=outputs).message() == (
        "Invalid offset + byte size for shared memory region: 'inputs'")
    inputs, _ = add_sub_request(regions, "inputs", None)
    output = module.InferRequestedOutput("OUTPUT0")
    output.set_shared_memory("small", 8)
    assert failure(client.infer, "add_sub", inputs, outputs=[output]).message() == (
        "shared memory size specified with the request for output 'OUTPUT0' (8 bytes) should "
        "be at least 64 bytes to hold the results")


def test_a_region_truncated_underneath_fails_the_request_not_the_server(
        regions: Regions, server: TritiumProcess) -> None:
    _, key = regions.make("shrinks", 2 * VECTOR)
    os.truncate(f"/dev/shm{key}", 8)
    inputs, outputs = add_sub_request(regions, "shrinks", None)
    error = failure(regions.client.infer, "add_sub", inputs, outputs=outputs)
    assert "smaller than when it was registered" in error.message()
    assert regions.client.is_server_live()


def test_cuda_shared_memory_is_not_supported(regions: Regions) -> None:
    """As Triton built without GPUs: registering says so, status lists none, unregistering
    has nothing to do."""
    client = regions.client
    # What cudashm.get_raw_handle gives: base64 text for HTTP's JSON, raw bytes for gRPC.
    handle: Any = "AAAA" if regions.module is httpclient else b"\0" * 64
    error = failure(client.register_cuda_shared_memory, "gpu", handle, 0, 64)
    assert error.message() == ("failed to register CUDA shared memory region: 'gpu', GPUs not "
                               "supported")
    if regions.module is httpclient:
        assert client.get_cuda_shared_memory_status() == []
    else:
        assert client.get_cuda_shared_memory_status(as_json=True) == {}
    client.unregister_cuda_shared_memory()


def test_http_register_body_and_output_checks(server: TritiumProcess) -> None:
    """http_server.cc: a register body without 'key' or 'byte_size', fields of the wrong
    type (TritonJson's bare refusal), and an shm output that also asks for binary data or
    classification."""
    base = f"http://{server.http_url}/v2/systemsharedmemory"
    for body, text in (({"byte_size": 8}, "Shared memory register request has no 'key' field"),
                       ({"key": "/k"}, "Shared memory register request has no 'byte_size' "
                        "field"),
                       ({"key": 1, "byte_size": 8}, "attempt to access JSON non-string as string"),
                       ({"key": "/k", "byte_size": -1}, "attempt to access JSON "
                        "non-unsigned-integer as unsigned-integer")):
        reply = requests.post(f"{base}/region/r/register", json=body, timeout=30)
        assert (reply.status_code, reply.json()) == (400, {"error": text})
    reply = requests.post(f"{base}/register", json={"key": "/k", "byte_size": 8}, timeout=30)
    assert reply.json() == {
        "error": "'region name' is necessary to register system shared memory region"}
    assert requests.get(f"{base}/region/r/register", timeout=30).status_code == 405
    for params, text in (({"binary_data": True},
                          "Output can't set both 'shared_memory_region' and 'binary_data'"),
                         ({"classification": 1}, "Output can't set both "
                          "'shared_memory_region' and 'classification'")):
        body = {"inputs": [{"name": n, "shape": [16], "datatype": "FP32", "data": [0.0] * 16}
                           for n in ("INPUT0", "INPUT1")],
                "outputs": [{"name": "OUTPUT0", "parameters": {
                    "shared_memory_region": "r", "shared_memory_byte_size": 64, **params}}]}
        reply = requests.post(f"http://{server.http_url}/v2/models/add_sub/infer", json=body,
                              timeout=30)
        assert (reply.status_code, reply.json()) == (400, {"error": text})


def test_registration_is_the_restricted_shared_memory_group(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Triton puts every shared memory endpoint in the restricted API group "shared-memory"
    (--http-restricted-api / --grpc-restricted-protocol): without its header, HTTP is 403
    and gRPC UNAVAILABLE; with it, registering works."""
    repo = tmp_path_factory.mktemp("restricted_shm")
    add_model(repo, "identity_bytes", "identity",
              _tensor("input", "INPUT0", "BYTES", "-1")
              + _tensor("output", "OUTPUT0", "BYTES", "-1"))
    process = TritiumProcess(repo, "--allow-client-shm=true",
                             "--http-restricted-api", "shared-memory:shm-key=s1",
                             "--grpc-restricted-protocol", "shared-memory:shm-key=s1").start()
    key = f"/tritium_e2e_{uuid.uuid4().hex}"
    handle = shm.create_shared_memory_region("r", key, 64)
    try:
        http = httpclient.InferenceServerClient(process.http_url)
        error = failure(http.register_system_shared_memory, "r", key, 64)
        assert error.message() == "This API is restricted, expecting header 'shm-key'"
        http.register_system_shared_memory("r", key, 64, headers={"shm-key": "s1"})
        grpc = grpcclient.InferenceServerClient(process.grpc_url)
        error = failure(grpc.get_system_shared_memory_status)
        assert error.status() == "StatusCode.UNAVAILABLE"
        grpc_key = {"triton-grpc-protocol-shm-key": "s1"}
        status = grpc.get_system_shared_memory_status(headers=grpc_key, as_json=True)
        assert list(status["regions"]) == ["r"]
        grpc.unregister_system_shared_memory(headers=grpc_key)
    finally:
        shm.destroy_shared_memory_region(handle)
        assert process.stop() == 0, process.log()
