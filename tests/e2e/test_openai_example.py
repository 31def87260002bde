"""The README's OpenAI example, as written, against the bundled example repository: the
bundled llm carries its chat template and tokenizer, so chat works and usage is counted."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import openai
import pytest

from tests.server_process import TritiumProcess
from tests.zoo import EXAMPLES


@pytest.fixture(scope="module")
def client() -> Iterator[openai.OpenAI]:
    process = TritiumProcess(EXAMPLES).start()
    try:
        with openai.OpenAI(base_url=f"http://{process.http_url}/v1", api_key="unused",
                           max_retries=0, timeout=60) as made:
            yield made
    finally:
        assert process.stop() == 0, process.log()


def test_readme_example_runs_as_shown(client: openai.OpenAI) -> None:
    assert "llm" in [m.id for m in client.models.list()]
    answer = client.completions.create(model="llm", prompt="tell me a story", max_tokens=8)
    assert answer.choices[0].text == "tell me a story tell me a story "
    text = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
        model="llm", stream=True, max_completion_tokens=32,
        messages=[{"role": "user", "content": "hello"}]))
    assert text == "hello " * 32


@pytest.mark.skipif(importlib.util.find_spec("tokenizers") is None,
                    reason="usage is counted with the tokenizer extra")
def test_bundled_llm_reports_usage(client: openai.OpenAI) -> None:
    answer = client.completions.create(model="llm", prompt="tell me a story", max_tokens=8)
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (4, 8)
    chunks = list(client.chat.completions.create(
        model="llm", stream=True, max_completion_tokens=3,
        stream_options={"include_usage": True},
        messages=[{"role": "system", "content": "be brief"},
                  {"role": "user", "content": "hello there"}]))
    usage = chunks[-1].usage
    assert usage is not None
    # The template joins the messages' contents: "be brief\nhello there".
    assert (usage.prompt_tokens, usage.completion_tokens) == (4, 3)
