"""The system shared memory registry, and the gRPC codec reading inputs from regions and
writing outputs into them, with real POSIX shared memory objects and no server."""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Iterator
from multiprocessing import shared_memory as mpshm

import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.http._utils import _get_inference_request

from tritium.core import messages, shared_memory
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.response import InferenceResponse
from tritium.core.service import EXTENSIONS
from tritium.core.shared_memory import SharedMemoryRegistry, extensions
from tritium.core.types import DataType, Tensor
from tritium.frontends.grpc import codec
from tritium.frontends.http import codec as http_codec

SIZE = 64


@pytest.fixture
def block() -> Iterator[mpshm.SharedMemory]:
    """A 64-byte shared memory object, as tritonclient's utilities make one."""
    memory = mpshm.SharedMemory(f"tritium_test_{uuid.uuid4().hex}", create=True, size=SIZE)
    yield memory
    memory.close()
    with contextlib.suppress(FileNotFoundError):
        memory.unlink()


@pytest.fixture
def registry() -> SharedMemoryRegistry:
    return SharedMemoryRegistry(allow_client=True)


def key_of(block: mpshm.SharedMemory) -> str:
    return "/" + block.name


def buffer_of(block: mpshm.SharedMemory) -> memoryview:
    assert block.buf is not None
    return block.buf


def error_of(call: object, *args: object) -> TritiumError:
    with pytest.raises(TritiumError) as info:
        call(*args)  # type: ignore[operator]
    return info.value


def descriptors_on(block: mpshm.SharedMemory) -> int:
    """How many of this process's descriptors are open on the object."""
    target = f"/dev/shm/{block.name}"
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == target
        except OSError:
            continue
    return count


# ------------------------------------------------------------------- registration


def test_register_status_unregister(registry: SharedMemoryRegistry,
                                    block: mpshm.SharedMemory) -> None:
    registry.register("r", key_of(block), 8, 32)
    [status] = registry.status()
    assert (status.name, status.key, status.offset, status.byte_size) == (
        "r", key_of(block), 8, 32)
    assert registry.status("r") == [status]
    registry.unregister("r")
    assert registry.status() == []
    registry.unregister("r")  # nothing to do is no error, as in Triton


def test_unregister_closes_the_descriptor_at_once(registry: SharedMemoryRegistry,
                                          block: mpshm.SharedMemory) -> None:
    before = descriptors_on(block)  # the test's own handle holds some
    registry.register("r", key_of(block), 0, SIZE)
    assert descriptors_on(block) == before + 1
    held = registry.slice("r", 0, 4)  # as a request in flight holds it
    registry.unregister_all()
    assert descriptors_on(block) == before
    error = error_of(held.read)
    assert (error.code, error.message) == (
        ErrorCode.NOT_FOUND, "Unable to find shared memory region: 'r'")


def test_disabled_registry_refuses_changes_but_reports_none(block: mpshm.SharedMemory) -> None:
    """Triton 2.73 without --allow-client-shm: register and unregister are UNSUPPORTED with
    its text naming the flag; status still answers (an empty list)."""
    registry = SharedMemoryRegistry()
    assert not registry.enabled
    for call, args in ((registry.register, ("r", key_of(block), 0, SIZE)),
                       (registry.unregister, ("r",)), (registry.unregister_all, ())):
        error = error_of(call, *args)
        assert (error.code, error.message) == (ErrorCode.UNSUPPORTED, messages.SHM_DISABLED)
    assert registry.status() == []


@pytest.mark.parametrize(("key", "text"), [
    ("///", "cannot register shared memory region 'r' - invalid shm key '///'"),
    ("/triton_python_backend_shm_region_7",
     "cannot register shared memory region 'r' with key '/triton_python_backend_shm_region_7' "
     "as the key contains the reserved prefix 'triton_python_backend_shm_region_'"),
    ("/no_such_object_here", "Unable to open shared memory region: '/no_such_object_here'"),
    ("/a/../../etc/passwd", "Unable to open shared memory region: '/a/../../etc/passwd'"),
    ("/x\x00y", "Unable to open shared memory region: '/x\x00y'"),
])
def test_bad_keys(registry: SharedMemoryRegistry, key: str, text: str) -> None:
    """Triton's ValidateSharedMemoryKey texts, and its shm_open failure; a key is never a
    path (an inner slash or NUL is refused, not followed)."""
    assert error_of(registry.register, "r", key, 0, 8).message == text


def test_symlink_and_fifo_are_not_regions(registry: SharedMemoryRegistry) -> None:
    name = f"tritium_test_{uuid.uuid4().hex}"
    os.symlink("/etc/hostname", f"/dev/shm/{name}")
    try:
        error = error_of(registry.register, "r", "/" + name, 0, 1)
        assert error.message == messages.SHM_CANNOT_OPEN.format(key="/" + name)
    finally:
        os.unlink(f"/dev/shm/{name}")
    os.mkfifo(f"/dev/shm/{name}")
    try:
        error = error_of(registry.register, "r", "/" + name, 0, 1)
        assert error.message == messages.SHM_NOT_A_REGION.format(key="/" + name)
    finally:
        os.unlink(f"/dev/shm/{name}")


def test_registration_bounds(registry: SharedMemoryRegistry, block: mpshm.SharedMemory) -> None:
    """Triton: offset + byte_size past the object is 'invalid args'; an empty mapping is
    mmap's EINVAL; a name registered twice ALREADY_EXISTS."""
    error = error_of(registry.register, "r", key_of(block), 8, SIZE)
    assert error.message == "failed to register shared memory region 'r': invalid args"
    error = error_of(registry.register, "r", key_of(block), 0, 0)
    assert error.message == ("failed to register shared memory region 'r': unable to process "
                             "address spaceInvalid argument")
    registry.register("r", key_of(block), 0, SIZE)
    error = error_of(registry.register, "r", key_of(block), 0, SIZE)
    assert (error.code, error.message) == (
        ErrorCode.ALREADY_EXISTS, "shared memory region 'r' already in manager")
    error = error_of(registry.status, "other")
    assert (error.code, error.message) == (
        ErrorCode.NOT_FOUND, "Unable to find system shared memory region: 'other'")


def test_number_of_regions_is_bounded(block: mpshm.SharedMemory) -> None:
    registry = SharedMemoryRegistry(allow_client=True, max_regions=2)
    registry.register("a", key_of(block), 0, 8)
    registry.register("b", key_of(block), 8, 8)
    error = error_of(registry.register, "c", key_of(block), 16, 8)
    assert "2 regions are registered already" in error.message
    registry.unregister("a")
    registry.register("c", key_of(block), 16, 8)


def test_cuda_is_not_supported(registry: SharedMemoryRegistry,
                               block: mpshm.SharedMemory) -> None:
    """As Triton built without GPUs: register refused, status lists none, unregister is a
    no-op; status of a system region's name says what it is."""
    error = error_of(registry.register_cuda, "g")
    assert error.message == ("failed to register CUDA shared memory region: 'g', GPUs not "
                             "supported")
    assert registry.cuda_status() == []
    registry.unregister_cuda("g")
    registry.register("r", key_of(block), 0, 8)
    assert "registered as system shared memory" in error_of(registry.cuda_status, "r").message
    assert error_of(registry.cuda_status, "g").code is ErrorCode.NOT_FOUND


def test_extension_is_listed_only_when_enabled() -> None:
    assert "system_shared_memory" not in extensions(EXTENSIONS, SharedMemoryRegistry())
    listed = extensions(EXTENSIONS, SharedMemoryRegistry(allow_client=True))
    assert listed.index("system_shared_memory") == listed.index("model_configuration") + 1


# --------------------------------------------------------------------------- use


def test_slice_checks(registry: SharedMemoryRegistry, block: mpshm.SharedMemory) -> None:
    """Triton's GetMemoryInfo: unknown region NOT_FOUND; offset at or past the region's end;
    offset + byte size past it."""
    registry.register("r", key_of(block), 16, 32)
    assert error_of(registry.slice, "x", 0, 4).message == "Unable to find shared memory region: 'x'"
    assert error_of(registry.slice, "r", 32, 0).message == (
        "Invalid offset for shared memory region: 'r'")
    assert error_of(registry.slice, "r", -1, 4).code is ErrorCode.INVALID_ARG
    assert error_of(registry.slice, "r", 8, 25).message == (
        "Invalid offset + byte size for shared memory region: 'r'")


def test_read_and_write_at_the_region_offset(registry: SharedMemoryRegistry,
                                             block: mpshm.SharedMemory) -> None:
    buffer_of(block)[16:24] = bytes(range(8))
    registry.register("r", key_of(block), 12, 40)
    data = registry.slice("r", 4, 8).read()
    assert data == bytes(range(8)) and not data.readonly  # a copy the model may write
    registry.output_slice("r", 20, 4).write_output("OUT", b"abcd")
    assert bytes(buffer_of(block)[32:36]) == b"abcd"
    error = error_of(registry.output_slice("r", 20, 4).write_output, "OUT", b"abcde")
    assert (error.code, error.message) == (ErrorCode.INTERNAL, (
        "shared memory size specified with the request for output 'OUT' (4 bytes) should be "
        "at least 5 bytes to hold the results"))


def test_a_region_truncated_underneath_is_an_error_not_a_crash(
        registry: SharedMemoryRegistry, block: mpshm.SharedMemory) -> None:
    registry.register("r", key_of(block), 0, SIZE)
    held = registry.output_slice("r", 32, 32)
    os.truncate(f"/dev/shm/{block.name}", 16)
    for call, args in ((held.read, ()), (held.write_output, ("OUT", b"x"))):
        error = error_of(call, *args)
        assert "smaller than when it was registered" in error.message
    assert os.stat(f"/dev/shm/{block.name}").st_size == 16, "a write never regrows the file"


# ---------------------------------------------------------------------- gRPC codec


def grpc_request(registry_region: str, with_raw: bool) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="m", id="r1")
    first = message.inputs.add(name="IN_SHM", datatype="INT32", shape=[2])
    first.parameters["shared_memory_region"].string_param = registry_region
    first.parameters["shared_memory_byte_size"].int64_param = 8
    first.parameters["shared_memory_offset"].int64_param = 4
    if with_raw:
        message.inputs.add(name="IN_RAW", datatype="INT32", shape=[1])
        message.raw_input_contents.append(np.array([9], np.int32).tobytes())
    out = message.outputs.add(name="OUT")
    out.parameters["shared_memory_region"].string_param = registry_region
    out.parameters["shared_memory_byte_size"].int64_param = 8
    out.parameters["shared_memory_offset"].int64_param = 32
    return message


def test_grpc_inputs_from_and_outputs_into_regions(registry: SharedMemoryRegistry,
                                                   block: mpshm.SharedMemory) -> None:
    """Triton's InferGRPCToInput: shm inputs take no raw entry, the others take theirs in
    order; an shm output is listed with an empty raw entry, its bytes in the region."""
    buffer_of(block)[4:12] = np.array([5, 6], np.int32).tobytes()
    registry.register("r", key_of(block), 0, SIZE)
    request = codec.decode_infer_request(grpc_request("r", with_raw=True), None, registry)
    assert request.inputs["IN_SHM"].data.tolist() == [5, 6]
    assert request.inputs["IN_RAW"].data.tolist() == [9]
    request.inputs["IN_SHM"].data[0] = 1  # writable, as binary inputs are
    output = Tensor("OUT", DataType.INT32, (2,), np.array([7, 8], np.int32))
    message = codec.infer_response_message(InferenceResponse(outputs=[output]), request)
    assert [o.name for o in message.outputs] == ["OUT"]
    assert list(message.raw_output_contents) == [b""]
    assert np.frombuffer(buffer_of(block)[32:40], np.int32).tolist() == [7, 8]


@pytest.mark.parametrize(("edit", "text"), [
    (lambda m: setattr(m.inputs[0].parameters["shared_memory_region"], "int64_param", 1),
     "invalid value type for 'shared_memory_region' parameter for tensor 'IN_SHM', expected "
     "string_param."),
    (lambda m: setattr(m.inputs[0].parameters["shared_memory_offset"], "string_param", "1"),
     "invalid value type for 'shared_memory_offset' parameter for tensor 'IN_SHM', expected "
     "int64_param."),
    (lambda m: m.inputs[0].parameters.pop("shared_memory_region"),
     "'shared_memory_offset' can not be specified without 'shared_memory_region' parameter "
     "for tensor 'IN_SHM'"),
    (lambda m: m.inputs[0].contents.int_contents.extend([1, 2]),
     "unexpected 'content' provided when using shared memory for input tensor 'IN_SHM' for "
     "model 'm'"),
    (lambda m: setattr(m.outputs[0].parameters["classification"], "int64_param", 1),
     "output can't set both 'shared_memory_region' and 'classification'"),
    (lambda m: setattr(m.inputs[0].parameters["shared_memory_byte_size"], "int64_param", 4),
     "input byte size mismatch for input 'IN_SHM'"),
])
def test_grpc_parameter_errors(registry: SharedMemoryRegistry, block: mpshm.SharedMemory,
                               edit: object, text: str) -> None:
    """Triton's ParseSharedMemoryParams texts (grpc_utils.h) and infer_handler.cc's."""
    registry.register("r", key_of(block), 0, SIZE)
    message = grpc_request("r", with_raw=False)
    edit(message)  # type: ignore[operator]
    error = error_of(codec.decode_infer_request, message, None, registry)
    assert error.code is ErrorCode.INVALID_ARG and text in error.message


def test_grpc_unknown_region(registry: SharedMemoryRegistry) -> None:
    error = error_of(codec.decode_infer_request, grpc_request("nope", False), None, registry)
    assert (error.code, error.message) == (
        ErrorCode.NOT_FOUND, "Unable to find shared memory region: 'nope'")


# ---------------------------------------------------------------------- HTTP codec


def http_body(region: str) -> bytes:
    """What tritonclient.http sends for INPUT0 in ``region`` at 4 and OUTPUT0 to it at 32."""
    tensor = httpclient.InferInput("IN_SHM", [2], "INT32")
    tensor.set_shared_memory(region, 8, offset=4)
    output = httpclient.InferRequestedOutput("OUT", binary_data=True)
    output.set_shared_memory(region, 8, offset=32)
    body, _ = _get_inference_request(
        inputs=[tensor], request_id="", outputs=[output], sequence_id=0, sequence_start=False,
        sequence_end=False, priority=0, timeout=None, custom_parameters=None)
    return body.encode() if isinstance(body, str) else body


def test_http_inputs_from_and_outputs_into_regions(registry: SharedMemoryRegistry,
                                                   block: mpshm.SharedMemory) -> None:
    """http_server.cc: an shm input's bytes come from the region; an shm output's entry has
    name, datatype and shape only, its bytes in the region."""
    buffer_of(block)[4:12] = np.array([5, 6], np.int32).tobytes()
    registry.register("r", key_of(block), 0, SIZE)
    request = http_codec.decode_infer_request(http_body("r"), None, "m", None,
                                              shared_memory=registry)
    assert request.inputs["IN_SHM"].data.tolist() == [5, 6]
    output = Tensor("OUT", DataType.INT32, (2,), np.array([7, 8], np.int32))
    _, parts = http_codec.encode_infer_response(InferenceResponse(outputs=[output]), request)
    assert orjson.loads(b"".join(bytes(part) for part in parts))["outputs"] == [
        {"name": "OUT", "datatype": "INT32", "shape": [2]}]
    assert np.frombuffer(buffer_of(block)[32:40], np.int32).tolist() == [7, 8]


def test_http_unknown_region_and_parameter_types(registry: SharedMemoryRegistry) -> None:
    error = error_of(http_codec.decode_infer_request, http_body("nope"), None, "m", None)
    assert (error.code, error.message) == (
        ErrorCode.NOT_FOUND, "Unable to find shared memory region: 'nope'")
    body = orjson.loads(http_body("r"))
    body["inputs"][0]["parameters"]["shared_memory_offset"] = -4
    error = error_of(http_codec.decode_infer_request, orjson.dumps(body), None, "m", None)
    assert error.message == ("Unable to parse 'shared_memory_offset': attempt to access JSON "
                             "non-unsigned-integer as unsigned-integer")


def test_a_read_is_bounded(registry: SharedMemoryRegistry, block: mpshm.SharedMemory,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A client can make a sparse object of any size for nothing; what one tensor copies out
    of it is bounded (the largest gRPC message)."""
    assert shared_memory.MAX_READ_BYTES == 2**31 - 1
    monkeypatch.setattr(shared_memory, "MAX_READ_BYTES", 8)
    registry.register("r", key_of(block), 0, SIZE)
    assert registry.slice("r", 0, 8).read() == bytearray(8)
    error = error_of(registry.slice("r", 0, 9).read)
    assert error.message == ("a tensor of 9 bytes can not be read from shared memory region "
                             "'r': at most 8 bytes are")


def test_unregister_during_a_read_closes_as_the_read_ends(
        registry: SharedMemoryRegistry, block: mpshm.SharedMemory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The descriptor is never closed under a read (its number could be reused for another
    file before the read is done); it is closed as that read ends."""
    started, go_on = threading.Event(), threading.Event()
    real_preadv = os.preadv

    def slow_preadv(fd: int, buffers: list[memoryview], offset: int) -> int:
        started.set()
        assert go_on.wait(30)
        return real_preadv(fd, buffers, offset)

    monkeypatch.setattr(shared_memory.os, "preadv", slow_preadv)
    buffer_of(block)[:4] = b"abcd"
    before = descriptors_on(block)
    registry.register("r", key_of(block), 0, SIZE)
    results: list[memoryview] = []
    reader = threading.Thread(target=lambda: results.append(registry.slice("r", 0, 4).read()))
    reader.start()
    assert started.wait(30)
    registry.unregister("r")
    assert descriptors_on(block) == before + 1, "closed under the read"
    go_on.set()
    reader.join(30)
    assert results == [bytearray(b"abcd")]
    assert descriptors_on(block) == before


def test_bytes_read_out_are_counted_until_the_last_view_of_them_dies(
        block: mpshm.SharedMemory) -> None:
    """Bytes copied out of regions count while a request holds them (any view will do);
    a read past the bound is UNAVAILABLE, and nothing of it stays counted."""
    registry = SharedMemoryRegistry(allow_client=True, max_bytes_in_flight=40)
    registry.register("r", key_of(block), 0, SIZE)
    first = registry.slice("r", 0, 24).read()
    tensor = np.frombuffer(first, np.float32)  # what a decoder makes of it
    del first
    assert registry.in_flight.held == 24
    error = error_of(registry.slice("r", 0, 17).read)
    assert error.code is ErrorCode.UNAVAILABLE and "try again later" in error.message
    assert registry.in_flight.held == 24
    del tensor
    assert registry.in_flight.held == 0
    assert len(registry.slice("r", 0, 40).read()) == 40


def test_a_big_read_is_never_made_on_an_event_loop_thread(block: mpshm.SharedMemory) -> None:
    import asyncio

    registry = SharedMemoryRegistry(allow_client=True)
    registry.register("r", key_of(block), 0, SIZE)
    big = shared_memory.Slice(registry.slice("r", 0, SIZE).region, 0, SIZE)
    object.__setattr__(big, "byte_size", shared_memory.offload.INLINE_BYTES + 1)

    async def on_loop() -> None:
        with pytest.raises(shared_memory.ReadOnLoop):
            big.read()

    asyncio.run(on_loop())


def test_registration_takes_only_the_servers_private_objects_under_the_prefix(
        block: mpshm.SharedMemory) -> None:
    registry = SharedMemoryRegistry(allow_client=True, key_prefix="/tritium_ok_")
    error = error_of(registry.register, "r", key_of(block), 0, 64)
    assert "does not start with '/tritium_ok_'" in error.message
    loose = SharedMemoryRegistry(allow_client=True)
    os.fchmod(block._fd, 0o622)  # type: ignore[attr-defined]  # others may write it
    error = error_of(loose.register, "r", key_of(block), 0, 64)
    assert "other users may write it" in error.message
    os.fchmod(block._fd, 0o600)  # type: ignore[attr-defined]
    loose.register("r", key_of(block), 0, 64)
    loose.close()


def test_regions_take_a_share_of_the_open_file_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each region holds a descriptor: with ``ulimit -n 1024`` clients may register 128, so
    regions cannot lock connections out; the bound never passes 1024."""
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 4096))
    assert SharedMemoryRegistry(allow_client=True).max_regions == 128
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1 << 20, 1 << 20))
    assert SharedMemoryRegistry(allow_client=True).max_regions == 1024
