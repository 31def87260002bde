"""Python models run in instance processes (``--python-instance-kind process``): what a
thread instance does, unchanged for model code, with tensors through shared memory."""

from __future__ import annotations

import json
import os
import queue
import socket
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.leaving_http import body, close, read_response
from tests.e2e.observe import Records, metric, wait_for_metric
from tests.server_process import TritiumProcess
from tests.zoo import ALL_DATATYPES, DECOUPLED, _parameter, _tensor, add_model

BIG_BYTES = 64 << 20
DYNAMIC = "dynamic_batching { max_queue_delay_microseconds: 300000 }\n"


def _identity_all_config() -> str:
    """One model echoing a tensor of every data type (INPUTk -> OUTPUTk)."""
    config = 'backend: "python"\nmax_batch_size: 0\n'
    for index, datatype in enumerate(ALL_DATATYPES):
        config += _tensor("input", f"INPUT{index}", datatype, "-1")
        config += _tensor("output", f"OUTPUT{index}", datatype, "-1")
    return config


def _repository(repo: Path, record_dir: Path) -> Path:
    add_model(repo, "identity_all", "identity", _identity_all_config())
    add_model(repo, "identity_fp32", "identity",
              'backend: "python"\nmax_batch_size: 0\n' + _tensor("input", "INPUT0", "FP32", "-1")
              + _tensor("output", "OUTPUT0", "FP32", "-1"))
    add_model(repo, "identity_thread", "identity",
              'backend: "python"\nmax_batch_size: 0\n' + _tensor("input", "INPUT0", "FP32", "-1")
              + _tensor("output", "OUTPUT0", "FP32", "-1")
              + _parameter("TRITIUM_INSTANCE_KIND", "thread"))
    add_model(repo, "identity_batch", "identity",
              "max_batch_size: 8\n" + DYNAMIC + _tensor("input", "INPUT0", "FP32", "-1")
              + _tensor("output", "OUTPUT0", "FP32", "-1"))
    add_model(repo, "add_sub", "add_sub",
              _tensor("input", "INPUT0", "FP32", "16") + _tensor("input", "INPUT1", "FP32", "16")
              + _tensor("output", "OUTPUT0", "FP32", "16")
              + _tensor("output", "OUTPUT1", "FP32", "16")
              + "instance_group [{ count: 2 kind: KIND_CPU }]\n")
    add_model(repo, "repeat", "repeat",
              DECOUPLED + _tensor("input", "INPUT0", "INT32", "1")
              + _tensor("input", "DELAY", "FP32", "1", " optional: true")
              + _tensor("output", "OUTPUT0", "INT32", "1"))
    add_model(repo, "async_sleep", "async_sleep",
              _tensor("input", "INPUT0", "FP32", "1") + _tensor("output", "OUTPUT0", "FP64", "2"))
    add_model(repo, "slow", "slow",
              _tensor("input", "INPUT0", "FP32", "1") + _tensor("output", "OUTPUT0", "FP32", "1")
              + _parameter("record_file", f"{record_dir}/slow.jsonl"))
    add_model(repo, "auto_complete_where", "auto_complete_where", "")
    add_model(repo, "auto_complete_exits", "auto_complete_where",
              _parameter("AUTO_COMPLETE_EXIT", "yes"))
    add_model(repo, "parameters_echo", "parameters_echo",
              _tensor("input", "INPUT0", "FP32", "1") + _tensor("output", "PARAMS", "BYTES", "1"))
    return repo


@pytest.fixture(scope="module")
def record_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("process_records")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, record_dir: Path
           ) -> Iterator[TritiumProcess]:
    repo = _repository(tmp_path_factory.mktemp("process_repo"), record_dir)
    process = TritiumProcess(repo, "--python-instance-kind", "process",
                             "--http-max-input-size", str(BIG_BYTES + (1 << 20)))
    process.start(timeout=180)
    yield process
    process.stop()


def _children(server: TritiumProcess) -> list[int]:
    """The server's child processes (its instances' guardians)."""
    return _children_of(server.pid)


def _children_of(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(child) for child in path.read_text().split()]


def test_instances_are_processes_of_their_own(server: TritiumProcess) -> None:
    """Each process-kind instance is a process of its own, under a guardian the server
    started; the model that asks for TRITIUM_INSTANCE_KIND thread has none: 9 models,
    add_sub with 2 instances."""
    guardians = [pid for pid in _children(server) if b"tritium.execution.process.guardian"
                 in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(guardians) == 10
    assert all(len(_children_of(pid)) == 1 for pid in guardians)


def test_auto_complete_runs_in_a_process_and_the_server_never_imports_the_model(
        server: TritiumProcess) -> None:
    """As in Triton, whose stub runs auto_complete_config: the completed config is served,
    the model answers, and every import of model.py was by another process."""
    config = httpclient.InferenceServerClient(server.http_url).get_model_config(
        "auto_complete_where")
    assert [tensor["name"] for tensor in config["input"]] == ["INPUT0"]
    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("INPUT0", [3], "INT32")
    tensor.set_data_from_numpy(np.array([1, 2, 3], dtype=np.int32))
    assert client.infer("auto_complete_where", [tensor]).as_numpy("OUTPUT0").tolist() == [2, 4, 6]
    record = server.repository / "auto_complete_where" / "1" / "imported_by.txt"
    importers = {int(line) for line in record.read_text().split()}
    assert len(importers) >= 2 and server.pid not in importers


def test_a_crash_in_auto_complete_fails_that_model_only(server: TritiumProcess) -> None:
    """auto_complete_config ends its process: the model is unavailable with the cause, and
    the server (which never ran that code) serves on."""
    index = requests.post(f"http://{server.http_url}/v2/repository/index", timeout=30).json()
    entry = next(e for e in index if e["name"] == "auto_complete_exits")
    assert entry["state"] == "UNAVAILABLE"
    assert "exited with code 3" in entry["reason"], entry
    assert requests.get(f"http://{server.http_url}/v2/health/live", timeout=30).ok


def _value(datatype: str) -> np.ndarray:
    if datatype == "BYTES":
        return np.array([b"ab", b"", b"\x00\xff", "é".encode()], dtype=np.object_)
    if datatype == "BF16":
        return np.array([1.5, -2.0, 3.25, 0.0], dtype=ml_dtypes.bfloat16)
    if datatype == "BOOL":
        return np.array([True, False, True, True])
    floats = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}
    dtype = floats[datatype] if datatype in floats else np.dtype(datatype.lower())
    return np.array([0, 1, 2, 3], dtype=dtype)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_identity_of_every_datatype(server: TritiumProcess, protocol: str) -> None:
    """Every data type, BYTES and BF16 included, comes back as sent through the arenas."""
    client_module = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    client = client_module.InferenceServerClient(url)
    inputs, sent = [], []
    for index, datatype in enumerate(ALL_DATATYPES):
        data = _value(datatype)
        tensor = client_module.InferInput(f"INPUT{index}", list(data.shape), datatype)
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
        sent.append(data)
    result = client.infer("identity_all", inputs)
    for index, data in enumerate(sent):
        got = result.as_numpy(f"OUTPUT{index}")
        assert got.tolist() == data.tolist(), ALL_DATATYPES[index]


def test_add_sub_on_two_instances_at_once(server: TritiumProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url, concurrency=8)
    a = np.arange(16, dtype=np.float32)
    pending = []
    for k in range(16):
        b = np.full(16, k, dtype=np.float32)
        tensors = [httpclient.InferInput("INPUT0", [16], "FP32"),
                   httpclient.InferInput("INPUT1", [16], "FP32")]
        tensors[0].set_data_from_numpy(a)
        tensors[1].set_data_from_numpy(b)
        pending.append((b, client.async_infer("add_sub", tensors)))
    for b, call in pending:
        result = call.get_result()
        assert np.array_equal(result.as_numpy("OUTPUT0"), a + b)
        assert np.array_equal(result.as_numpy("OUTPUT1"), a - b)
    client.close()  # not left to the collector: its pool must be closed on this thread


def _stats(server: TritiumProcess, model: str) -> dict[str, int]:
    reply = requests.get(f"http://{server.http_url}/v2/models/{model}/stats", timeout=30)
    stats = reply.json()["model_stats"][0]
    return {"inferences": int(stats["inference_count"]),
            "executions": int(stats["execution_count"])}


def test_a_dynamic_batch_runs_as_one_execute(server: TritiumProcess) -> None:
    """Four requests queued within the batching delay run in one execute in the child,
    and each gets its own rows back."""
    before = _stats(server, "identity_batch")
    client = httpclient.InferenceServerClient(server.http_url, concurrency=4)
    calls = []
    for k in range(4):
        data = np.full((1, 3), k, dtype=np.float32)
        tensor = httpclient.InferInput("INPUT0", [1, 3], "FP32")
        tensor.set_data_from_numpy(data)
        calls.append((data, client.async_infer("identity_batch", [tensor])))
    for data, call in calls:
        assert np.array_equal(call.get_result().as_numpy("OUTPUT0"), data)
    client.close()
    after = _stats(server, "identity_batch")
    assert after["inferences"] - before["inferences"] == 4
    assert after["executions"] - before["executions"] < 4


def test_decoupled_responses_stream_out_as_sent(server: TritiumProcess) -> None:
    """repeat sends from a thread of its own, 300 ms apart: the first response reaches the
    client long before the last is sent (streamed, not gathered at the end)."""
    received: queue.Queue[tuple[float, object]] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: received.put(
        (time.monotonic(), error if error is not None else result)))
    try:
        count, delay = np.array([3], dtype=np.int32), np.array([300.0], dtype=np.float32)
        tensors = [grpcclient.InferInput("INPUT0", [1], "INT32"),
                   grpcclient.InferInput("DELAY", [1], "FP32")]
        tensors[0].set_data_from_numpy(count)
        tensors[1].set_data_from_numpy(delay)
        client.async_stream_infer("repeat", tensors, enable_empty_final_response=True)
        arrivals, values = [], []
        while True:
            at, result = received.get(timeout=30)
            assert not isinstance(result, Exception), result
            response = result.get_response()  # type: ignore[attr-defined]
            if response.outputs:
                arrivals.append(at)
                values.append(int(result.as_numpy("OUTPUT0")[0]))  # type: ignore[attr-defined]
            if response.parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
    assert values == [0, 1, 2]
    assert arrivals[-1] - arrivals[0] > 0.4


def test_async_execute_runs_requests_concurrently(server: TritiumProcess) -> None:
    """async def execute in the child: two 0.5 s sleeps sent together overlap in one batch
    or two, and each answer carries the times its coroutine saw."""
    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([0.2], dtype=np.float32))
    result = client.infer("async_sleep", [tensor]).as_numpy("OUTPUT0")
    assert result.dtype == np.float64 and result[1] - result[0] >= 0.19


def test_request_parameters_reach_the_child(server: TritiumProcess) -> None:
    """The request's parameters as the model reads them (the model's own config parameters
    reach it too: slow finds its record_file there, see the cancel test)."""
    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    out = client.infer("parameters_echo", [tensor], parameters={"p": "q", "n": 3})
    assert json.loads(out.as_numpy("PARAMS")[0]) == {"p": "q", "n": 3}


def test_cancel_reaches_a_polling_model_in_its_process(server: TritiumProcess,
                                                       record_dir: Path) -> None:
    """The client closes its connection while slow polls is_cancelled() in the child: the
    flag in shared memory flips at once, so the model stops well within a second."""
    records = Records(record_dir / "slow.jsonl")
    rid = f"cancel-{os.getpid()}-{time.monotonic_ns()}"
    payload = body("infer", rid, {"INPUT0": 30.0})
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
    sock.sendall(b"POST /v2/models/slow/infer HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Type: application/json\r\n"
                 + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    records.wait_for(rid, "start", timeout=30)
    left = time.monotonic()
    close(sock)
    stopped = records.wait_for(rid, "cancelled", timeout=30)
    assert stopped - left < 1.0
    assert "done" not in records.events(rid)


def _send_slow(server: TritiumProcess, rid: str, seconds: float) -> socket.socket:
    payload = body("infer", rid, {"INPUT0": seconds})
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
    sock.sendall(b"POST /v2/models/slow/infer HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Type: application/json\r\n"
                 + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    return sock


def test_a_request_cancelled_while_waiting_at_its_process_never_runs(
        server: TritiumProcess, record_dir: Path) -> None:
    """A second request is handed to the process while the first runs (it waits there,
    counted pending); its client leaves: the process skips it, its slot comes back, and
    the instance goes on serving."""
    records = Records(record_dir / "slow.jsonl")
    tag = f"{os.getpid()}-{time.monotonic_ns()}"
    first, second = f"running-{tag}", f"waiting-{tag}"
    running = _send_slow(server, first, 1.5)
    records.wait_for(first, "start", timeout=30)
    before = metric(server.metrics_url, "nv_inference_pending_request_count", model="slow")
    waiting = _send_slow(server, second, 0.0)
    wait_for_metric(server.metrics_url, "nv_inference_pending_request_count", before + 1,
                    timeout=30, model="slow")
    close(waiting)
    records.wait_for(first, "done", timeout=30)
    head, _ = read_response(running)
    close(running)
    assert head.startswith(b"HTTP/1.1 200"), head
    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([0.0], dtype=np.float32))
    after = f"after-{tag}"
    assert client.infer("slow", [tensor], request_id=after).as_numpy("OUTPUT0")[0] == 0.0
    assert records.events(second) == []  # never reached execute
    assert records.events(after) == ["start", "done"]
    wait_for_metric(server.metrics_url, "nv_inference_pending_request_count", before,
                    timeout=30, model="slow")


def _big_infer(url: str, model: str, data: np.ndarray) -> tuple[float, np.ndarray]:
    client = httpclient.InferenceServerClient(url, network_timeout=300)
    tensor = httpclient.InferInput("INPUT0", [data.size], "FP32")
    tensor.set_data_from_numpy(data, binary_data=True)
    started = time.monotonic()
    out = client.infer(model, [tensor]).as_numpy("OUTPUT0")
    return time.monotonic() - started, out


def test_a_64_mib_tensor_is_not_much_slower_than_on_a_thread(server: TritiumProcess) -> None:
    """64 MiB each way: the result is exact, and the best of three round trips through the
    process kind stays within a generous bound of the thread kind's (the copy each way)."""
    data = np.random.default_rng(0).random(BIG_BYTES // 4, dtype=np.float32)
    infer = partial(_big_infer, server.http_url)
    process_times, thread_times = [], []
    for _ in range(3):
        elapsed, out = infer("identity_fp32", data)
        assert np.array_equal(out, data)
        process_times.append(elapsed)
        elapsed, out = infer("identity_thread", data)
        assert np.array_equal(out, data)
        thread_times.append(elapsed)
    assert min(process_times) < min(thread_times) * 1.5 + 0.25, (process_times, thread_times)


def test_stopping_the_server_finalizes_and_reaps_every_instance(
        tmp_path: Path, record_dir: Path) -> None:
    """A server of its own: on SIGTERM every instance process is stopped and none is left."""
    repo = tmp_path / "repo"
    add_model(repo, "identity_fp32", "identity",
              _tensor("input", "INPUT0", "FP32", "-1") + _tensor("output", "OUTPUT0", "FP32", "-1")
              + "instance_group [{ count: 2 kind: KIND_CPU }]\n")
    process = TritiumProcess(repo, "--python-instance-kind", "process").start(timeout=120)
    try:
        children = _children(process)
        assert len(children) == 2
    finally:
        assert process.stop() == 0
    for pid in children:
        assert not Path(f"/proc/{pid}").exists() or _is_zombie_of_other(pid)


def _is_zombie_of_other(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except FileNotFoundError:
        return True
