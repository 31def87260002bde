"""Tracing as Triton does it, against a real OTLP/HTTP receiver on loopback: the span tree
of a plain infer, a decoupled stream, a BLS model (``trace=request.trace()``), an ensemble
and a cancelled request; W3C ``traceparent`` on HTTP, gRPC and the OpenAI routes; and the
trace settings changed at run time."""

from __future__ import annotations

import json
import queue
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.ensemble_repos import add_ensemble, chain, ensemble_config
from tests.e2e.openai_models import SAMPLING_IO, TEXT_IO
from tests.e2e.otlp_receiver import OtlpReceiver, Span
from tests.server_process import TritiumProcess
from tests.zoo import DECOUPLED, _parameter, _tensor, add_model

pytestmark = pytest.mark.e2e

FP32_IO = _tensor("input", "INPUT0", "FP32", "-1") + _tensor("output", "OUTPUT0", "FP32", "-1")
ROOT_EVENTS = ["HTTP_RECV_START", "HTTP_RECV_END", "HTTP_SEND_START", "HTTP_SEND_END"]
MODEL_EVENTS = ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
COMPUTE_EVENTS = ["COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]


def build_trace_repository(repo: Path) -> Path:
    add_model(repo, "identity_fp32", "identity", FP32_IO)
    add_model(repo, "second", "identity", FP32_IO)
    add_model(repo, "busy", "busy", FP32_IO + _parameter("iterations", "300000"))
    add_model(repo, "traced_bls", "traced_bls",
              FP32_IO + _tensor("output", "CONTEXT", "BYTES", "1"))
    add_model(repo, "repeat", "repeat",
              DECOUPLED + _tensor("input", "INPUT0", "INT32", "1")
              + _tensor("input", "DELAY", "FP32", "1", " optional: true")
              + _tensor("output", "OUTPUT0", "INT32", "1"))
    add_model(repo, "until_cancelled", "until_cancelled",
              DECOUPLED + "".join(_tensor("input", name, kind, "1") for name, kind in (
                  ("INPUT0", "INT32"), ("COUNT", "INT32"), ("DELAY", "INT32"),
                  ("IGNORE_CANCEL", "BOOL")))
              + _tensor("output", "OUTPUT0", "INT32", "1"))
    add_model(repo, "text_echo", "text_words",
              TEXT_IO + SAMPLING_IO + _parameter("mode", "echo"))
    add_ensemble(repo, "pipeline", ensemble_config(chain("identity_fp32", "second")))
    return repo


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    otlp = OtlpReceiver()
    yield otlp
    otlp.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, receiver: OtlpReceiver,
           instance_kind: str) -> Iterator[TritiumProcess]:
    repo = build_trace_repository(tmp_path_factory.mktemp(f"trace_repo_{instance_kind}"))
    proc = TritiumProcess(
        repo, "--python-instance-kind", instance_kind,
        "--trace-config", "mode=opentelemetry", "--trace-config", "level=TIMESTAMPS",
        "--trace-config", "rate=1", "--trace-config", f"opentelemetry,url={receiver.url}",
        "--trace-config", "opentelemetry,bsp_schedule_delay=50",
        "--trace-config", "opentelemetry,resource=service.name=tritium-under-test",
    ).start()
    yield proc
    proc.stop()


def traceparent() -> tuple[str, str, str]:
    """A fresh W3C context: (header value, trace id, span id)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def fp32_input(client: Any, values: list[float]) -> Any:
    tensor = client.InferInput("INPUT0", [len(values)], "FP32")
    tensor.set_data_from_numpy(np.array(values, dtype=np.float32))
    return tensor


def named(spans: list[Span], name: str) -> list[Span]:
    return [span for span in spans if span.name == name]


def one(spans: list[Span], name: str) -> Span:
    found = named(spans, name)
    assert len(found) == 1, [span.name for span in spans]
    return found[0]


def test_plain_infer_is_triton_span_tree(server: TritiumProcess, receiver: OtlpReceiver
                                         ) -> None:
    header, trace_id, parent = traceparent()
    client = httpclient.InferenceServerClient(server.http_url)
    result = client.infer("identity_fp32", [fp32_input(httpclient, [1.0, 2.0])],
                          request_id="plain-1", headers={"traceparent": header})
    assert result.as_numpy("OUTPUT0").tolist() == [1.0, 2.0]
    spans = receiver.trace(trace_id, 3)
    root, model, compute = (one(spans, name) for name in
                            ("InferRequest", "identity_fp32", "compute"))
    assert root.parent_id == parent  # the client's span is the root's parent
    assert model.parent_id == root.span_id and compute.parent_id == model.span_id
    assert root.events == ROOT_EVENTS
    assert model.events == MODEL_EVENTS
    assert compute.events == COMPUTE_EVENTS
    assert model.attributes == {
        "triton.model_name": "identity_fp32", "triton.model_version": 1,
        "triton.trace_id": model.attributes["triton.trace_id"], "triton.trace_parent_id": 0,
        "triton.request_id": "plain-1"}
    assert root.start_ns <= model.start_ns <= compute.start_ns <= compute.end_ns <= root.end_ns
    assert root.resource["service.name"] == "tritium-under-test"


def test_grpc_traceparent_from_metadata(server: TritiumProcess, receiver: OtlpReceiver
                                        ) -> None:
    header, trace_id, parent = traceparent()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.infer("identity_fp32", [fp32_input(grpcclient, [3.0])],
                 headers={"traceparent": header})
    spans = receiver.trace(trace_id, 3)
    root = one(spans, "InferRequest")
    assert root.parent_id == parent
    assert root.events == ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "GRPC_SEND_START",
                           "GRPC_SEND_END"]
    assert one(spans, "identity_fp32").parent_id == root.span_id


def test_openai_traceparent(server: TritiumProcess, receiver: OtlpReceiver) -> None:
    header, trace_id, parent = traceparent()
    reply = requests.post(f"http://{server.http_url}/v1/completions",
                          json={"model": "text_echo", "prompt": "hi"},
                          headers={"traceparent": header}, timeout=30)
    assert reply.status_code == 200, reply.text
    spans = receiver.trace(trace_id, 3)
    root = one(spans, "InferRequest")
    assert root.parent_id == parent
    assert one(spans, "text_echo").parent_id == root.span_id
    assert one(spans, "compute").events == COMPUTE_EVENTS


def test_decoupled_stream_spans(server: TritiumProcess, receiver: OtlpReceiver) -> None:
    header, trace_id, _ = traceparent()
    responses: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(lambda result, error: responses.put((result, error)),
                        headers={"traceparent": header})
    count = grpcclient.InferInput("INPUT0", [1], "INT32")
    count.set_data_from_numpy(np.array([3], dtype=np.int32))
    client.async_stream_infer("repeat", [count], request_id="stream-1")
    got = [responses.get(timeout=30) for _ in range(3)]
    client.stop_stream()
    assert all(error is None for _, error in got)
    spans = receiver.trace(trace_id, 3)
    root, model, compute = (one(spans, name) for name in ("InferRequest", "repeat", "compute"))
    assert model.parent_id == root.span_id and compute.parent_id == model.span_id
    assert model.events == MODEL_EVENTS and compute.events == COMPUTE_EVENTS
    # The model span lasts until FINAL, which its thread may send before or after
    # execute() returned.
    assert model.start_ns <= compute.start_ns and model.end_ns >= compute.start_ns


def test_generate_stream_traceparent(server: TritiumProcess, receiver: OtlpReceiver) -> None:
    header, trace_id, parent = traceparent()
    reply = requests.post(f"http://{server.http_url}/v2/models/repeat/generate_stream",
                          json={"INPUT0": 2}, headers={"traceparent": header}, timeout=30)
    assert reply.status_code == 200 and reply.text.count("data:") == 2, reply.text
    spans = receiver.trace(trace_id, 3)
    root = one(spans, "InferRequest")
    assert root.parent_id == parent and root.events[-1] == "HTTP_SEND_END"
    assert one(spans, "repeat").parent_id == root.span_id


def test_bls_child_nests_under_compute(server: TritiumProcess, receiver: OtlpReceiver) -> None:
    header, trace_id, _ = traceparent()
    client = httpclient.InferenceServerClient(server.http_url)
    result = client.infer("traced_bls", [fp32_input(httpclient, [5.0])],
                          headers={"traceparent": header})
    spans = receiver.trace(trace_id, 5)
    parent, child = one(spans, "traced_bls"), one(spans, "identity_fp32")
    parent_compute, child_compute = sorted(named(spans, "compute"), key=lambda s: s.start_ns)
    assert parent_compute.parent_id == parent.span_id
    assert child.parent_id == parent_compute.span_id
    assert child_compute.parent_id == child.span_id
    assert child.attributes["triton.trace_parent_id"] == parent.attributes["triton.trace_id"]
    # get_context(): the W3C context of the executing request's span.
    context = json.loads(result.as_numpy("CONTEXT")[0])
    assert context == {"traceparent": f"00-{trace_id}-{parent.span_id}-01"}


def test_ensemble_steps_are_children(server: TritiumProcess, receiver: OtlpReceiver) -> None:
    header, trace_id, _ = traceparent()
    client = httpclient.InferenceServerClient(server.http_url)
    ensemble_input = httpclient.InferInput("IN", [2], "FP32")
    ensemble_input.set_data_from_numpy(np.array([1.0, 2.0], dtype=np.float32))
    result = client.infer("pipeline", [ensemble_input], headers={"traceparent": header})
    assert result.as_numpy("OUT").tolist() == [1.0, 2.0]
    spans = receiver.trace(trace_id, 6)
    root, ensemble = one(spans, "InferRequest"), one(spans, "pipeline")
    assert ensemble.parent_id == root.span_id
    steps = [one(spans, "identity_fp32"), one(spans, "second")]
    assert all(step.parent_id == ensemble.span_id for step in steps)
    computes = named(spans, "compute")
    assert sorted(c.parent_id for c in computes) == sorted(s.span_id for s in steps)
    ensemble_id = ensemble.attributes["triton.trace_id"]
    assert all(s.attributes["triton.trace_parent_id"] == ensemble_id for s in steps)


def test_cancelled_request_spans_say_so(server: TritiumProcess, receiver: OtlpReceiver) -> None:
    header, trace_id, _ = traceparent()
    responses: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(lambda result, error: responses.put((result, error)),
                        headers={"traceparent": header})
    inputs = []
    for name, kind, value in (("INPUT0", "INT32", 7), ("COUNT", "INT32", 1000),
                              ("DELAY", "INT32", 20), ("IGNORE_CANCEL", "BOOL", False)):
        tensor = grpcclient.InferInput(name, [1], kind)
        tensor.set_data_from_numpy(np.array([value], dtype=np.bool_ if kind == "BOOL"
                                            else np.int32))
        inputs.append(tensor)
    client.async_stream_infer("until_cancelled", inputs)
    assert responses.get(timeout=30)[1] is None  # it is executing
    client.stop_stream(cancel_requests=True)
    spans = receiver.trace(trace_id, 3)
    model, compute = one(spans, "until_cancelled"), one(spans, "compute")
    assert "REQUEST_CANCELLED" in model.events
    assert model.event_attributes["REQUEST_CANCELLED"] == {
        "tritium.cancel.reason": "client cancelled", "tritium.cancel.stage": "executing"}
    assert model.status == 2  # ERROR
    # The model saw is_cancelled(), sent FINAL and returned: when it stopped, and how long
    # after the cancel; the model span lasts until then.
    assert model.events[-1] == "MODEL_STOPPED"
    assert model.event_attributes["MODEL_STOPPED"]["tritium.cancel.stop_delay_us"] >= 0
    assert compute.events[-2:] == ["MODEL_STOPPED", "COMPUTE_END"]
    delay = compute.event_attributes["MODEL_STOPPED"]["tritium.cancel.stop_delay_us"]
    assert 0 <= delay < 10_000_000


def test_trace_settings_at_run_time(server: TritiumProcess, receiver: OtlpReceiver) -> None:
    base = f"http://{server.http_url}/v2"
    tag = f"{server.pid}-"  # the receiver outlives this server: its spans are told apart
    settings = requests.get(f"{base}/trace/setting", timeout=10).json()
    assert settings == {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "-1",
                        "trace_mode": "opentelemetry", "url": receiver.url,
                        "resource": "service.name=tritium-under-test",
                        "bsp_schedule_delay": "50"}
    # One model traced every 2nd request, for 1 more trace; the others as before.
    model = requests.post(f"{base}/models/second/trace/setting", timeout=10,
                          json={"trace_rate": "2", "trace_count": "1"}).json()
    assert (model["trace_rate"], model["trace_count"]) == ("2", "1")
    assert requests.get(f"{base}/trace/setting", timeout=10).json()["trace_rate"] == "1"
    client = httpclient.InferenceServerClient(server.http_url)
    for index in range(5):
        client.infer("second", [fp32_input(httpclient, [1.0])], request_id=f"{tag}rated-{index}")
    traced = receiver.wait_for(
        lambda spans: any(s.attributes.get("triton.request_id") == f"{tag}rated-1" for s in spans))
    ids = {s.attributes.get("triton.request_id") for s in traced}
    assert f"{tag}rated-1" in ids
    assert not ids & {f"{tag}rated-{index}" for index in (0, 2, 3, 4)}
    got = requests.get(f"{base}/models/second/trace/setting", timeout=10).json()
    assert got["trace_count"] == "0"
    # Null clears the model's own settings: it falls back to the global ones.
    cleared = requests.post(f"{base}/models/second/trace/setting", timeout=10,
                            json={"trace_rate": None, "trace_count": None}).json()
    assert (cleared["trace_rate"], cleared["trace_count"]) == ("1", "-1")
    refused = requests.post(f"{base}/trace/setting", json={"trace_file": "/tmp/x"}, timeout=10)
    assert refused.status_code != 200 and "can not be updated" in refused.json()["error"]
    # gRPC TraceSetting reads and changes the same settings.
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    off = grpc.update_trace_settings(settings={"trace_level": ["OFF"]}, as_json=True)
    assert off["settings"]["trace_level"]["value"] == ["OFF"]
    client.infer("second", [fp32_input(httpclient, [1.0])], request_id=f"{tag}while-off")
    per_model = grpc.update_trace_settings(model_name="second", settings={"trace_rate": "7"},
                                           as_json=True)
    assert per_model["settings"]["trace_rate"]["value"] == ["7"]
    assert grpc.get_trace_settings(as_json=True)["settings"]["trace_rate"]["value"] == ["1"]
    grpc.update_trace_settings(model_name="second", settings={"trace_rate": None})
    back = grpc.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]}, as_json=True)
    assert back["settings"]["trace_level"]["value"] == ["TIMESTAMPS"]
    client.infer("second", [fp32_input(httpclient, [1.0])], request_id=f"{tag}back-on")
    spans = receiver.wait_for(
        lambda got: any(s.attributes.get("triton.request_id") == f"{tag}back-on" for s in got))
    assert not any(s.attributes.get("triton.request_id") == f"{tag}while-off" for s in spans)


def test_a_request_behind_a_busy_instance_computes_after_the_one_before(
        server: TritiumProcess, receiver: OtlpReceiver) -> None:
    """The second request waits (in the scheduler's queue, or at a process instance that
    runs the first): its compute span begins once the first one's has ended."""
    contexts = [traceparent() for _ in range(2)]
    results: queue.Queue[Any] = queue.Queue()
    client = httpclient.InferenceServerClient(server.http_url, concurrency=2)
    try:
        pending = [client.async_infer("busy", [fp32_input(httpclient, [float(i)])],
                                      headers={"traceparent": header})
                   for i, (header, _, _) in enumerate(contexts)]
        for request in pending:
            results.put(request.get_result().as_numpy("OUTPUT0").tolist())
    finally:
        client.close()
    assert sorted(results.get() + results.get()) == [0.0, 1.0]
    computes = [one(receiver.trace(trace_id, 3), "compute") for _, trace_id, _ in contexts]
    first, second = sorted(computes, key=lambda span: span.start_ns)
    assert second.start_ns >= first.end_ns - 1_000_000  # clocks: the same monotonic one


def test_trace_file_mode(tmp_path: Path) -> None:
    repo = build_trace_repository(tmp_path / "repo")
    trace_file = tmp_path / "trace.json"
    server = TritiumProcess(repo, "--trace-config", f"triton,file={trace_file}",
                            "--trace-config", "level=TIMESTAMPS", "--trace-config",
                            "level=TENSORS", "--trace-config", "rate=1")
    server.start()
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        client.infer("traced_bls", [fp32_input(httpclient, [2.0])], request_id="file-1")
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        assert grpc.get_trace_settings(as_json=True)["settings"]["trace_file"]["value"] == [
            str(trace_file)]
    finally:
        assert server.stop() == 0
    records = json.loads(trace_file.read_text())
    headers = [r for r in records if "model_name" in r]
    parent = next(r for r in headers if r["model_name"] == "traced_bls")
    child = next(r for r in headers if r["model_name"] == "identity_fp32")
    assert parent == {"id": parent["id"], "model_name": "traced_bls", "model_version": 1,
                      "request_id": "file-1"}
    assert child == {"id": child["id"], "model_name": "identity_fp32", "model_version": 1,
                     "parent_id": parent["id"]}

    def names(trace_id: int) -> list[str]:
        return [r["timestamps"][0]["name"] for r in records
                if r["id"] == trace_id and "timestamps" in r]

    # The frontend's timestamps share the top-level request's id, as in Triton.
    assert names(parent["id"]) == [
        "HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START", "COMPUTE_START",
        "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END",
        "HTTP_SEND_START", "HTTP_SEND_END"]
    assert names(child["id"]) == ["REQUEST_START", "QUEUE_START", *COMPUTE_EVENTS,
                                  "REQUEST_END"]
    stamps = [r["timestamps"][0]["ns"] for r in records if r["id"] == parent["id"]
              and "timestamps" in r]
    assert stamps[0] <= stamps[4] <= stamps[7] <= stamps[-1]
    # Level TENSORS: what each request queued with, and what its model returned.
    tensors = [(r["id"], r["activity"], r["tensor"]) for r in records if "tensor" in r]
    assert (parent["id"], "TENSOR_QUEUE_INPUT",
            {"name": "INPUT0", "data": "2.0", "shape": "1", "dtype": "FP32"}) in tensors
    assert (child["id"], "TENSOR_BACKEND_OUTPUT",
            {"name": "OUTPUT0", "data": "2.0", "shape": "1", "dtype": "FP32"}) in tensors
    context = next(t for _, activity, t in tensors if t["name"] == "CONTEXT")
    assert context == {"name": "CONTEXT", "data": '""', "shape": "1", "dtype": "BYTES"}




def test_client_leaving_a_stream_shows_when_the_model_stopped(
        server: TritiumProcess, receiver: OtlpReceiver) -> None:
    header, trace_id, _ = traceparent()
    with requests.post(f"http://{server.http_url}/v2/models/repeat/generate_stream",
                       json={"INPUT0": 1000, "DELAY": 20.0}, headers={"traceparent": header},
                       stream=True, timeout=30) as reply:
        assert next(reply.iter_lines()).startswith(b"data:")
    # The connection is closed: the model (a thread sending every 20 ms) sees is_cancelled()
    # and sends FINAL, which ends its span.
    spans = receiver.trace(trace_id, 3)
    model = one(spans, "repeat")
    assert model.event_attributes["REQUEST_CANCELLED"] == {
        "tritium.cancel.reason": "client disconnected", "tritium.cancel.stage": "executing"}
    assert model.events[-2:] == ["REQUEST_END", "MODEL_STOPPED"]
    assert model.event_attributes["MODEL_STOPPED"]["tritium.cancel.stop_delay_us"] < 10_000_000
