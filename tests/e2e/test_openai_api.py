"""OpenAI's API on /v1 with the official ``openai`` SDK (sync, async, streaming).

Model mapping follows Triton's OpenAI frontend (python/openai, engine/utils/triton.py): the
prompt goes in ``text_input``, the answer comes from ``text_output``, ``stream`` and
``max_tokens`` (a chat's ``max_completion_tokens`` first, then ``max_tokens``) and the
sampling fields go to inputs of those names (TensorRT-LLM's stop list is ``stop_words``), and
a model that does not declare one never gets it. Unknown models are a 404 naming the model,
as Triton's models router answers.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import requests

from tests.e2e.observe import metric
from tests.e2e.openai_models import (
    base_url,
    client,
    openai_records,
    openai_server,
    word_tokenizer,
)
from tests.server_process import TritiumProcess
from tests.zoo import EXAMPLES

__all__ = ["client", "openai_records", "openai_server"]  # fixtures


def echoed(client: openai.OpenAI, model: str = "text_echo", **fields: Any) -> dict[str, Any]:
    """What the echo model received for a completion of ``fields``."""
    answer = client.completions.create(model=model, prompt="hi there", **fields)
    return json.loads(answer.choices[0].text)


def test_models_list_and_retrieve(client: openai.OpenAI) -> None:
    names = [model.id for model in client.models.list()]
    assert {"llm", "token_engine", "text_echo", "identity_fp32"} <= set(names)
    model = client.models.retrieve("llm")
    assert (model.id, model.object) == ("llm", "model")


def test_unknown_model_is_not_found_naming_it(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("no_such_model")
    assert "no_such_model" in caught.value.message
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="no_such_model", prompt="x")
    assert caught.value.code == "model_not_found"
    assert "no_such_model" in caught.value.message


def test_completion_on_a_decoupled_model_joins_its_responses(client: openai.OpenAI) -> None:
    answer = client.completions.create(model="token_engine", prompt="one two", max_tokens=5)
    assert answer.object == "text_completion" and answer.model == "token_engine"
    assert answer.choices[0].text == "one two one two one "
    assert answer.choices[0].finish_reason == "stop"


def test_completion_on_a_bls_model(client: openai.OpenAI) -> None:
    answer = client.completions.create(model="llm", prompt="a b c", max_tokens=4)
    assert answer.choices[0].text == "a b c a "


def test_completion_usage_from_the_models_token_counts(client: openai.OpenAI) -> None:
    answer = client.completions.create(model="text_words", prompt="x y z", max_tokens=3)
    assert answer.choices[0].text == "x y z "
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens,
            answer.usage.total_tokens) == (3, 3, 6)
    assert answer.choices[0].finish_reason == "length"


def test_fields_reach_declared_inputs_in_their_types(client: openai.OpenAI) -> None:
    seen = echoed(client, max_tokens=7, temperature=0.5, top_p=0.25, seed=42,
                  stop=["END", "STOP"], frequency_penalty=1.0)
    assert seen["text_input"] == {"datatype": "object", "shape": [1], "values": ["hi there"]}
    assert seen["max_tokens"] == {"datatype": "int32", "shape": [1], "values": [7]}
    assert seen["stream"] == {"datatype": "bool", "shape": [1], "values": [False]}
    assert seen["temperature"] == {"datatype": "float32", "shape": [1], "values": [0.5]}
    assert seen["top_p"] == {"datatype": "float64", "shape": [1], "values": [0.25]}
    assert seen["seed"] == {"datatype": "uint64", "shape": [1], "values": [42]}
    assert seen["stop_words"] == {"datatype": "object", "shape": [2], "values": ["END", "STOP"]}
    # Not declared by the model: left out, and the request still succeeds.
    assert "frequency_penalty" not in seen


def test_batched_model_gets_a_batch_of_one(client: openai.OpenAI) -> None:
    seen = echoed(client, model="text_echo_batched", temperature=1.0)
    assert seen["text_input"]["shape"] == [1, 1]
    assert seen["temperature"] == {"datatype": "float32", "shape": [1, 1], "values": [1.0]}


def test_undeclared_fields_are_not_passed(client: openai.OpenAI) -> None:
    answer = client.completions.create(model="text_words", prompt="p", max_tokens=2,
                                       temperature=0.3, seed=1, stop="x")
    assert answer.choices[0].text == "p p "


def test_streamed_completion(client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(model="token_engine", prompt="w v", max_tokens=3,
                                            stream=True))
    texts = [chunk.choices[0].text for chunk in chunks]
    assert texts == ["w ", "v ", "w ", ""]
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert len({chunk.id for chunk in chunks}) == 1


def test_streamed_completion_with_usage(client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(model="text_stream", prompt="a b", max_tokens=4,
                                            stream=True,
                                            stream_options={"include_usage": True}))
    assert all(chunk.usage is None for chunk in chunks[:-1])
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (2, 4)
    assert chunks[-2].choices[0].finish_reason == "length"


def test_stream_ends_with_done_event(openai_server: TritiumProcess) -> None:
    """Raw SSE: every event is a `data:` line, the last one `data: [DONE]`."""
    reply = requests.post(f"{base_url(openai_server)}/completions", timeout=60, json={
        "model": "llm", "prompt": "go", "max_tokens": 2, "stream": True})
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = [e for e in reply.text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    assert [json.loads(e[6:])["choices"][0]["text"] for e in events[:-1]] == ["go ", "go ", ""]


def test_chat_renders_the_models_template(client: openai.OpenAI) -> None:
    """The prompt is the tokenizer_config.json template rendered with add_generation_prompt;
    token_engine (behind llm) answers with the prompt's words."""
    answer = client.chat.completions.create(
        model="llm", max_completion_tokens=6,
        messages=[{"role": "system", "content": "be brief"},
                  {"role": "user", "content": [{"type": "text", "text": "hello"}]}])
    assert answer.object == "chat.completion"
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content == "<s>[system] be brief [user] hello [assistant] "


def test_chat_streamed(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(
        model="llm", max_tokens=3, stream=True, messages=[{"role": "user", "content": "q"}]))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
    assert text == "<s>[user] q [assistant] "
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_chat_without_a_template_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="token_engine",
                                       messages=[{"role": "user", "content": "x"}])
    assert "no chat template" in caught.value.message


@pytest.mark.parametrize(("fields", "param"), [
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": 5}, "temperature"),
    ({"n": 2}, "n"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"stop": 3}, "stop"),
    ({"logprobs": 2}, "logprobs"),
    ({"echo": True}, "echo"),
    ({"best_of": 3}, "best_of"),
])
def test_bad_parameters_are_bad_requests(client: openai.OpenAI, fields: dict[str, Any],
                                         param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="text_echo", prompt="x", **fields)
    assert caught.value.param == param
    assert caught.value.type == "invalid_request_error"


def test_value_that_does_not_fit_the_input_type_is_a_bad_request(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="text_echo", prompt="x", seed=-1)
    assert caught.value.param == "seed"


def test_not_a_text_model_is_a_bad_request(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="identity_fp32", prompt="x")
    assert "text_input" in caught.value.message


def test_error_object_shape(openai_server: TritiumProcess) -> None:
    reply = requests.post(f"{base_url(openai_server)}/completions", data=b"{not json",
                          timeout=60)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"


def test_async_client(openai_server: TritiumProcess) -> None:
    async def main() -> list[str]:
        async with openai.AsyncOpenAI(base_url=base_url(openai_server), api_key="unused",
                                      max_retries=0, timeout=60) as aclient:
            whole = await aclient.completions.create(model="token_engine", prompt="z",
                                                     max_tokens=2)
            stream = await aclient.chat.completions.create(
                model="llm", max_tokens=2, stream=True,
                messages=[{"role": "user", "content": "r"}])
            parts = [chunk.choices[0].delta.content or "" async for chunk in stream]
            return [whole.choices[0].text, "".join(parts)]

    assert asyncio.run(main()) == ["z z ", "<s>[user] r "]


def test_metrics_count_requests_tokens_and_latencies(openai_server: TritiumProcess,
                                                     client: openai.OpenAI) -> None:
    """Four words streamed: one request, 4 generated and 2 prompt tokens (the model's counts),
    one time to first token and three inter-token latencies, each about the model's 20 ms
    step."""
    url = openai_server.metrics_url
    labels = {"model": "text_stream", "version": "1"}

    def read() -> list[float]:
        return [metric(url, "tritium_openai_request", endpoint="completions",
                       outcome="success", **labels),
                metric(url, "tritium_openai_generation_tokens", **labels),
                metric(url, "tritium_openai_prompt_tokens", **labels),
                metric(url, "tritium_openai_time_to_first_token_seconds_count", **labels),
                metric(url, "tritium_openai_inter_token_latency_seconds_count", **labels),
                metric(url, "tritium_openai_inter_token_latency_seconds_sum", **labels)]

    before = read()
    list(client.completions.create(model="text_stream", prompt="a b", max_tokens=4,
                                   stream=True))
    after = read()
    assert [b - a for a, b in zip(before, after, strict=True)][:5] == [1, 4, 2, 1, 3]
    assert 0.01 < (after[5] - before[5]) / 3 < 2.0


def test_model_error_mid_stream_is_an_error_event(client: openai.OpenAI) -> None:
    """After text was sent the status is 200 already: the error comes as an event with
    OpenAI's error object, which the SDK raises."""
    stream = client.completions.create(model="text_stream", prompt="a b fail", max_tokens=5,
                                       stream=True)
    texts = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in stream:
            texts.append(chunk.choices[0].text)
    assert texts == ["a ", "b "]
    assert "failed at word 3" in caught.value.message


@pytest.mark.parametrize(("model", "stream"), [("text_stream", True), ("text_words", False),
                                               ("text_stream", False)])
def test_model_error_before_any_text_is_a_server_error(client: openai.OpenAI, model: str,
                                                       stream: bool) -> None:
    with pytest.raises(openai.InternalServerError) as caught:
        answer = client.completions.create(model=model, prompt="fail", max_tokens=2,
                                           stream=stream)
        if stream:  # a stream's status comes with its first event
            list(answer)
    assert caught.value.status_code == 500
    assert "failed at word 1" in caught.value.message


def test_usage_counted_by_the_models_tokenizer(client: openai.OpenAI) -> None:
    """token_engine reports no counts; its directory's tokenizer.json counts them: the
    prompt with the tokenizer's special tokens (BOS), the answer without."""
    answer = client.completions.create(model="token_engine", prompt="one two", max_tokens=3)
    assert answer.choices[0].text == "one two one "
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens,
            answer.usage.total_tokens) == (3, 3, 6)
    # Only the model's own counts tell that it stopped at the limit.
    assert answer.choices[0].finish_reason == "stop"


def test_chat_usage_counts_the_rendered_prompt(client: openai.OpenAI) -> None:
    """A chat prompt has its BOS from the template: counted without special tokens, as the
    same tokenizer counts the rendered template."""
    chunks = list(client.chat.completions.create(
        model="llm", max_tokens=2, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "one two"}]))
    usage = chunks[-1].usage
    assert usage is not None
    prompt = "<s>[user] one two [assistant]"
    tokenizer = word_tokenizer()
    assert usage.prompt_tokens == len(tokenizer.encode(prompt, add_special_tokens=False).ids)
    assert usage.completion_tokens == len(tokenizer.encode("<s>[user] one ",
                                                           add_special_tokens=False).ids)


@pytest.fixture
def tokenizer_server(tmp_path: Path) -> Iterator[TritiumProcess]:
    """A server whose --tokenizer directory serves token_engine, which has no files of its
    own."""
    repo, shared = tmp_path / "repo", tmp_path / "tokenizer"
    shutil.copytree(EXAMPLES / "token_engine", repo / "token_engine")
    shared.mkdir()
    (shared / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"}))
    word_tokenizer().save(str(shared / "tokenizer.json"))
    process = TritiumProcess(repo, "--tokenizer", str(shared)).start()
    yield process
    assert process.stop() == 0, process.log()


def test_tokenizer_flag_serves_models_without_their_own(tokenizer_server: TritiumProcess
                                                        ) -> None:
    with openai.OpenAI(base_url=base_url(tokenizer_server), api_key="unused",
                       max_retries=0) as own:
        answer = own.chat.completions.create(
            model="token_engine", max_tokens=3, messages=[{"role": "user", "content": "one"}])
    assert answer.choices[0].message.content == "one one one "
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (1, 3)


def test_unknown_v1_endpoint_is_an_openai_error(openai_server: TritiumProcess) -> None:
    reply = requests.post(f"{base_url(openai_server)}/embeddings", json={}, timeout=60)
    assert reply.status_code == 404
    assert reply.json()["error"]["type"] == "invalid_request_error"
    reply = requests.delete(f"{base_url(openai_server)}/models", timeout=60)
    assert reply.status_code == 405
    assert set(reply.json()["error"]) == {"message", "type", "param", "code"}
