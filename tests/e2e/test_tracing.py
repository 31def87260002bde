"""Tracing as Triton does it, against a real OTLP/HTTP receiver on loopback: the span tree
of a plain infer, a decoupled stream, a BLS model (``trace=request.trace()``), an ensemble
and a cancelled request; W3C ``traceparent`` on HTTP, gRPC and the OpenAI routes; and the
trace settings changed at run time."""

from __future__ import annotations

import json
import queue
import secrets
from collections.abc import Iterator
from functools import partial
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
def server(tmp_path_factory: pytest.TempPathFactory, receiver: OtlpReceiver
           ) -> Iterator[TritiumProcess]:
    repo = build_trace_repository(tmp_path_factory.mktemp("trace_repo"))
    proc = TritiumProcess(
        repo, "--trace-config", "mode=opentelemetry", "--trace-config", "level=TIMESTAMPS",
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
