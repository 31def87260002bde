"""Attacks through client shared memory: a tiny request naming a huge sparse region is read
off the event loop while others are served, and only the server's own user's private
objects, under the allowed key prefix, can be registered at all."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.e2e.bystander import Bystander, health_url
from tests.server_process import TritiumProcess
from tests.zoo import _tensor, add_model

INSTANCE_KINDS = ("thread",)

PREFIX = "/tritium_limits_"
HUGE = 512 << 20


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritiumProcess]:
    repo = tmp_path_factory.mktemp("shm_limits")
    add_model(repo, "identity_bytes", "identity",
              _tensor("input", "INPUT0", "BYTES", "-1")
              + _tensor("output", "OUTPUT0", "BYTES", "-1"))
    process = TritiumProcess(repo, "--allow-client-shm=true",
                             "--client-shm-key-prefix", PREFIX).start()
    yield process
    assert process.stop() == 0, process.log()


@contextlib.contextmanager
def shm_object(size: int, mode: int = 0o600, key: str = "") -> Iterator[str]:
    """A POSIX shared memory object of ``size`` bytes, sparse (it costs nothing)."""
    key = key or f"{PREFIX}{uuid.uuid4().hex}"
    path = Path("/dev/shm") / key.lstrip("/")
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode)
    try:
        os.fchmod(fd, mode)  # past the umask
        os.ftruncate(fd, size)
        yield key
    finally:
        os.close(fd)
        path.unlink()


def register(server: TritiumProcess, name: str, key: str, size: int) -> requests.Response:
    return requests.post(f"http://{server.http_url}/v2/systemsharedmemory/region/{name}/register",
                         json={"key": key, "offset": 0, "byte_size": size}, timeout=30)


def test_a_tiny_request_naming_a_huge_region_is_read_off_the_loop(
        server: TritiumProcess) -> None:
    """A request of a few hundred bytes whose one BYTES element names a 512 MiB sparse
    region: the copy (once made on the event loop, stalling everyone for seconds) runs on a
    worker, over HTTP and gRPC, and an unrelated client is served throughout."""
    with shm_object(HUGE) as key:
        assert register(server, "huge", key, HUGE).status_code == 200
        body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "BYTES",
                            "parameters": {"shared_memory_region": "huge",
                                           "shared_memory_byte_size": HUGE}}]}
        bystander = Bystander(health_url(server.http_url))
        with bystander.watching() as latencies:
            reply = requests.post(f"http://{server.http_url}/v2/models/identity_bytes/infer",
                                  json=body, timeout=120)
            assert len(reply.request.body or b"") < 400
            with grpcclient.InferenceServerClient(server.grpc_url) as client:
                tensor = grpcclient.InferInput("INPUT0", [1], "BYTES")
                tensor.set_shared_memory("huge", HUGE)
                with contextlib.suppress(InferenceServerException):
                    client.infer("identity_bytes", [tensor])
        bystander.close()
        requests.post(f"http://{server.http_url}/v2/systemsharedmemory/region/huge/unregister",
                      timeout=30)
    assert reply.status_code in (200, 400), reply.text
    bystander.assert_served(latencies)


def test_a_key_outside_the_allowed_prefix_is_refused(server: TritiumProcess) -> None:
    with shm_object(4096, key=f"/tritium_other_{uuid.uuid4().hex}") as key:
        reply = register(server, "outside", key, 4096)
    assert reply.status_code == 400
    assert f"does not start with '{PREFIX}'" in reply.json()["error"]


def test_an_object_others_may_write_is_refused(server: TritiumProcess) -> None:
    with shm_object(4096, mode=0o666) as key:
        reply = register(server, "shared", key, 4096)
    assert reply.status_code == 400
    assert "belongs to another user, or other users may write it" in reply.json()["error"]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving an object away takes root")
def test_another_users_object_is_refused(server: TritiumProcess) -> None:
    """Even readable and writable by the server (it runs as root here), another user's
    object is no client region of this server's."""
    with shm_object(4096, mode=0o644) as key:
        os.chown(Path("/dev/shm") / key.lstrip("/"), 65534, 65534)
        reply = register(server, "theirs", key, 4096)
    assert reply.status_code == 400
    assert "belongs to another user" in reply.json()["error"]
