"""The example repository's LLM-shaped ensemble (tokenizer -> token_engine -> detokenizer,
TensorRT-LLM's preprocessing -> engine -> postprocessing): it streams token by token over
/generate_stream and ModelStreamInfer, and a client that leaves stops the engine."""

from __future__ import annotations

import json
import queue
import shutil
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient

from tests.server_process import TritiumProcess
from tests.zoo import EXAMPLES

MODELS = ("tokenizer", "token_engine", "detokenizer", "llm_ensemble")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritiumProcess]:
    repo = tmp_path_factory.mktemp("example_ensemble")
    for name in MODELS:
        shutil.copytree(EXAMPLES / name, repo / name)
    process = TritiumProcess(repo).start()
    yield process
    assert process.stop() == 0, process.log()


def test_the_ensemble_is_decoupled_because_its_engine_is(server: TritiumProcess) -> None:
    config = requests.get(f"http://{server.http_url}/v2/models/llm_ensemble/config",
                          timeout=10).json()
    assert config["platform"] == "ensemble"
    assert config["model_transaction_policy"] == {"decoupled": True}


def test_generate_stream_streams_each_token_through_the_detokenizer(
        server: TritiumProcess) -> None:
    body = {"text_input": "The Quick brown FOX", "max_tokens": 6}
    reply = requests.post(f"http://{server.http_url}/v2/models/llm_ensemble/generate_stream",
                          json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    events = [json.loads(line.removeprefix("data: "))
              for line in reply.text.splitlines() if line.startswith("data: ")]
    # Lower-cased by the tokenizer, the word marks taken off by the detokenizer.
    assert [e["text_output"] for e in events] == ["the ", "quick ", "brown ", "fox ", "the ",
                                                  "quick "]


def test_model_stream_infer_streams_each_token(server: TritiumProcess) -> None:
    results: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put(error or result))
    try:
        prompt = grpcclient.InferInput("text_input", [1], "BYTES")
        prompt.set_data_from_numpy(np.array([b"one two"], dtype=np.object_))
        limit = grpcclient.InferInput("max_tokens", [1], "INT32")
        limit.set_data_from_numpy(np.array([3], dtype=np.int32))
        client.async_stream_infer("llm_ensemble", [prompt, limit], request_id="s1",
                                  enable_empty_final_response=True)
        texts = []
        while True:
            result = results.get(timeout=30)
            assert not isinstance(result, Exception), result
            params = result.get_response().parameters
            if result.as_numpy("text_output") is not None:
                texts.append(result.as_numpy("text_output")[0])
            if params["triton_final_response"].bool_param:
                break
        assert texts == [b"one ", b"two ", b"one "]
    finally:
        client.stop_stream()


def test_a_client_that_leaves_stops_the_engine(server: TritiumProcess) -> None:
    """The README's demo: closing the connection mid-stream cancels the engine's request,
    which stops long before the 500 tokens asked for."""
    start = len(server.lines)
    body = {"text_input": "the quick brown fox", "max_tokens": 500}
    with requests.post(f"http://{server.http_url}/v2/models/llm_ensemble/generate_stream",
                       json=body, stream=True, timeout=60) as reply:
        lines = reply.iter_lines()
        received = [line for line, _ in zip(lines, range(6), strict=False) if line]
        assert received, "no token arrived"
    line = server.wait_for_line("token_engine: request '' cancelled after", timeout=30,
                                start=start)
    done = int(line.split("cancelled after ")[1].split(" ")[0])
    assert done < 500
