"""TLS and mutual TLS on the gRPC and HTTP listeners of a real server, with tritonclient (sync
and aio) and requests; certificates are made for the test run."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

from tests.certificates import Pki
from tests.e2e.observe import Records
from tests.server_process import TritiumProcess
from tests.zoo import add_model

# Thread kind only: TLS on the listeners, the same whichever kind of instance answers.
INSTANCE_KINDS = ("thread",)

MODEL = "identity_fp32"
HEADER_TIMEOUT_S = 3
TENSORS = ('input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [-1] }]\n'
           'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [-1] }]\n')


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> Records:
    return Records(tmp_path_factory.mktemp("tls_records") / "slow.jsonl")


@pytest.fixture(scope="module")
def tls_repo(tmp_path_factory: pytest.TempPathFactory, records: Records) -> Path:
    repo = tmp_path_factory.mktemp("tls_repo")
    add_model(repo, MODEL, "identity", TENSORS)
    add_model(repo, "slow", "slow",
              'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [1] }]\n'
              'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [1] }]\n'
              f'parameters {{ key: "record_file" value {{ string_value: "{records.path}" }} }}\n')
    return repo


def tls_flags(pki: Pki, mode: str) -> list[str]:
    flags = []
    for proto in ("grpc", "http"):
        flags += [f"--{proto}-{mode}", "true", f"--{proto}-server-cert", str(pki.server_cert),
                  f"--{proto}-server-key", str(pki.server_key),
                  f"--{proto}-root-cert", str(pki.ca)]
    return flags


@pytest.fixture(scope="module")
def tls_server(tls_repo: Path, pki: Pki) -> Iterator[TritiumProcess]:
    process = TritiumProcess(tls_repo, *tls_flags(pki, "use-ssl"),
                             "--http-header-timeout-secs", str(HEADER_TIMEOUT_S)).start()
    yield process
    assert process.stop() == 0, process.log()


@pytest.fixture(scope="module")
def mtls_server(tls_repo: Path, pki: Pki) -> Iterator[TritiumProcess]:
    process = TritiumProcess(tls_repo, *tls_flags(pki, "use-ssl-mutual")).start()
    yield process
    assert process.stop() == 0, process.log()


def grpc_inputs(values: list[float]) -> list[grpcclient.InferInput]:
    inputs = [grpcclient.InferInput("INPUT0", [len(values)], "FP32")]
    inputs[0].set_data_from_numpy(np.array(values, dtype=np.float32))
    return inputs


def http_inputs(values: list[float]) -> list[httpclient.InferInput]:
    inputs = [httpclient.InferInput("INPUT0", [len(values)], "FP32")]
    inputs[0].set_data_from_numpy(np.array(values, dtype=np.float32))
    return inputs


def client_cert(pki: Pki, who: str) -> dict[str, str]:
    if who == "none":
        return {}
    cert, key = ((pki.client_cert, pki.client_key) if who == "client"
                 else (pki.stranger_cert, pki.stranger_key))
    return {"private_key": str(key), "certificate_chain": str(cert)}


# -- gRPC -------------------------------------------------------------------------------------


def test_grpc_over_tls_with_the_sync_client(tls_server: TritiumProcess, pki: Pki) -> None:
    with grpcclient.InferenceServerClient(tls_server.grpc_url, ssl=True,
                                          root_certificates=str(pki.ca)) as client:
        assert client.is_server_ready(client_timeout=30)
        result = client.infer(MODEL, grpc_inputs([1.5, 2.5]), client_timeout=30)
        assert result.as_numpy("OUTPUT0").tolist() == [1.5, 2.5]


def test_grpc_over_tls_with_the_aio_client(tls_server: TritiumProcess, pki: Pki) -> None:
    async def scenario() -> list[float]:
        async with grpcaio.InferenceServerClient(tls_server.grpc_url, ssl=True,
                                                 root_certificates=str(pki.ca)) as client:
            result = await client.infer(MODEL, grpc_inputs([3.0]), client_timeout=30)
            return result.as_numpy("OUTPUT0").tolist()

    assert asyncio.run(scenario()) == [3.0]


def test_grpc_tls_listener_does_not_serve_plaintext(tls_server: TritiumProcess) -> None:
    with grpcclient.InferenceServerClient(tls_server.grpc_url) as client, \
            pytest.raises(InferenceServerException, match="UNAVAILABLE"):
        client.is_server_live(client_timeout=10)


@pytest.mark.parametrize(("endpoint", "offered", "selected"), [
    ("gRPC", ["h2", "http/1.1"], "h2"), ("HTTP", ["h2", "http/1.1"], "http/1.1")])
def test_alpn_selects_the_listeners_protocol(tls_server: TritiumProcess, pki: Pki,
                                             endpoint: str, offered: list[str],
                                             selected: str) -> None:
    context = ssl.create_default_context(cafile=str(pki.ca))
    context.set_alpn_protocols(offered)
    address = ("127.0.0.1", tls_server.ports[endpoint])
    with socket.create_connection(address, timeout=30) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        assert tls.selected_alpn_protocol() == selected


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "aio"])
def test_grpc_mutual_tls_serves_a_client_with_a_certificate(
        mtls_server: TritiumProcess, pki: Pki, sync: bool) -> None:
    options = {"ssl": True, "root_certificates": str(pki.ca), **client_cert(pki, "client")}
    if sync:
        with grpcclient.InferenceServerClient(mtls_server.grpc_url, **options) as client:
            result = client.infer(MODEL, grpc_inputs([4.0]), client_timeout=30)
        assert result.as_numpy("OUTPUT0").tolist() == [4.0]
        return

    async def scenario() -> bool:
        async with grpcaio.InferenceServerClient(mtls_server.grpc_url, **options) as client:
            return await client.is_server_live(client_timeout=30)

    assert asyncio.run(scenario()) is True


@pytest.mark.parametrize("who", ["none", "stranger"])
def test_grpc_mutual_tls_refuses_other_clients(mtls_server: TritiumProcess, pki: Pki,
                                               who: str) -> None:
    with grpcclient.InferenceServerClient(mtls_server.grpc_url, ssl=True,
                                          root_certificates=str(pki.ca),
                                          **client_cert(pki, who)) as client, \
            pytest.raises(InferenceServerException, match="UNAVAILABLE"):
        client.is_server_live(client_timeout=10)


# -- HTTPS ------------------------------------------------------------------------------------

INFER_BODY = {"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [7, 8]}]}


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_https_with_requests(tls_server: TritiumProcess, pki: Pki, host: str) -> None:
    base = f"https://{host}:{tls_server.http_port}"
    assert requests.get(f"{base}/v2/health/ready", verify=str(pki.ca), timeout=30).status_code \
        == 200
    reply = requests.post(f"{base}/v2/models/{MODEL}/infer", json=INFER_BODY,
                          verify=str(pki.ca), timeout=30)
    assert reply.status_code == 200, reply.text
    assert reply.json()["outputs"][0]["data"] == [7, 8]


def test_https_listener_does_not_serve_plaintext(tls_server: TritiumProcess) -> None:
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://{tls_server.http_url}/v2/health/ready", timeout=30)


def test_https_with_tritonclient_http(tls_server: TritiumProcess, pki: Pki) -> None:
    client = httpclient.InferenceServerClient(tls_server.http_url, ssl=True,
                                              ssl_options={"ca_certs": str(pki.ca)})
    try:
        assert client.is_server_ready()
        assert client.infer(MODEL, http_inputs([9.0])).as_numpy("OUTPUT0").tolist() == [9.0]
    finally:
        client.close()


def test_https_with_tritonclient_http_aio(tls_server: TritiumProcess, pki: Pki) -> None:
    async def scenario() -> list[float]:
        context = ssl.create_default_context(cafile=str(pki.ca))
        client = httpaio.InferenceServerClient(tls_server.http_url, ssl=True,
                                               ssl_context=context)
        try:
            result = await client.infer(MODEL, http_inputs([10.0]))
            return result.as_numpy("OUTPUT0").tolist()
        finally:
            await client.close()

    assert asyncio.run(scenario()) == [10.0]


def test_https_mutual_tls(mtls_server: TritiumProcess, pki: Pki) -> None:
    url = f"https://127.0.0.1:{mtls_server.http_port}/v2/health/ready"
    cert = (str(pki.client_cert), str(pki.client_key))
    assert requests.get(url, verify=str(pki.ca), cert=cert, timeout=30).status_code == 200
    for refused in (None, (str(pki.stranger_cert), str(pki.stranger_key))):
        with pytest.raises(requests.ConnectionError):  # SSLError is one
            requests.get(url, verify=str(pki.ca), cert=refused, timeout=30)
    client = httpclient.InferenceServerClient(
        mtls_server.http_url, ssl=True,
        ssl_options={"ca_certs": str(pki.ca), "certfile": cert[0], "keyfile": cert[1]})
    try:
        assert client.infer(MODEL, http_inputs([11.0])).as_numpy("OUTPUT0").tolist() == [11.0]
    finally:
        client.close()


def test_closing_a_tls_connection_cancels_its_request(tls_server: TritiumProcess, pki: Pki,
                                                       records: Records) -> None:
    rid = uuid.uuid4().hex[:12]
    body = json.dumps({"id": rid, "inputs": [
        {"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [30]}]}).encode()
    head = (f"POST /v2/models/slow/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/json"
            f"\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    context = ssl.create_default_context(cafile=str(pki.ca))
    raw = socket.create_connection(("127.0.0.1", tls_server.http_port), timeout=30)
    tls = context.wrap_socket(raw, server_hostname="127.0.0.1")
    tls.sendall(head + body)
    records.wait_for(rid, "start", timeout=30)
    tls.close()  # no close_notify: the TCP connection just ends, as when a client dies
    records.wait_for(rid, "cancelled", timeout=10)
    tls_server.wait_for_line(f"request {rid} for model 'slow' version 1 cancelled while executing")
    assert "done" not in records.events(rid)


def test_a_stalled_tls_handshake_is_closed_after_the_header_timeout(
        tls_server: TritiumProcess) -> None:
    with socket.create_connection(("127.0.0.1", tls_server.http_port), timeout=60) as raw:
        started = time.monotonic()
        with contextlib.suppress(ConnectionResetError):  # closed, or reset: either is gone
            assert raw.recv(1) == b""
        assert time.monotonic() - started < HEADER_TIMEOUT_S + 20


def test_a_key_that_does_not_match_stops_the_server_in_one_line(pki: Pki) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tritium", "serve", "--grpc-use-ssl", "true",
         "--grpc-server-cert", str(pki.server_cert), "--grpc-server-key", str(pki.client_key)],
        capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith("tritium: error: --grpc-use-ssl: server certificate")
    assert errors[0].endswith("key values mismatch")
