"""OpenAI frontend pieces without a server: error mapping, restricted groups, templates."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.model import ModelHandle
from tritium.core.restrictions import ApiGroup
from tritium.frontends.http.openai.chat import ChatTemplates, messages_of
from tritium.frontends.http.openai.endpoints import read_body
from tritium.frontends.http.openai.errors import OpenAIError, from_tritium
from tritium.frontends.http.restricted import group_of


@pytest.mark.parametrize(("code", "message", "status"), [
    (ErrorCode.UNAVAILABLE, "Exceeds maximum queue size", 429),
    (ErrorCode.UNAVAILABLE, "Server is shutting down and not accepting new requests", 503),
    (ErrorCode.INVALID_ARG, "bad", 400),
    (ErrorCode.NOT_FOUND, "gone", 404),
    (ErrorCode.INTERNAL, "boom", 500),
])
def test_core_errors_map_to_openai_statuses(code: ErrorCode, message: str, status: int) -> None:
    error = from_tritium(TritiumError(code, message))
    assert error.status == status
    assert json.loads(error.body())["error"]["message"] == message


@pytest.mark.parametrize(("path", "group"), [
    ("/v1/models", ApiGroup.METADATA), ("/v1/models/llm", ApiGroup.METADATA),
    ("/v1/completions", ApiGroup.INFERENCE), ("/v1/chat/completions", ApiGroup.INFERENCE),
])
def test_openai_paths_are_restricted_like_their_v2_counterparts(path: str,
                                                                group: ApiGroup) -> None:
    assert group_of(path) is group


def model_in(directory: Path | None) -> ModelHandle:
    fake: Any = SimpleNamespace(name="m", model_dir=directory)
    return cast(ModelHandle, fake)


def test_template_from_tokenizer_config_with_special_tokens(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": [{"name": "default", "template":
                           "{{ bos_token }}{% for m in messages %}{{ m.content | tojson }}"
                           "{% endfor %}{% if add_generation_prompt %}>{% endif %}"}],
        "bos_token": {"content": "<s>", "lstrip": False}}))
    template = ChatTemplates().for_model(model_in(tmp_path))
    messages = messages_of({"messages": [{"role": "user", "content": "a<b"}]})
    assert template.render(messages) == '<s>"a<b">'


def test_template_file_beside_the_config_wins(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "old"}))
    (tmp_path / "chat_template.jinja").write_text("new")
    assert ChatTemplates().for_model(model_in(tmp_path)).render([]) == "new"


def test_raise_exception_in_a_template_is_a_bad_request(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": "{{ raise_exception('roles must alternate') }}"}))
    with pytest.raises(OpenAIError) as caught:
        ChatTemplates().for_model(model_in(tmp_path)).render([])
    assert caught.value.status == 400 and "roles must alternate" in caught.value.message


def test_no_template_says_so(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))
    for model in (model_in(tmp_path), model_in(None)):
        with pytest.raises(OpenAIError) as caught:
            ChatTemplates().for_model(model)
        assert caught.value.status == 400 and "no chat template" in caught.value.message


def test_block_tags_are_trimmed_as_transformers_does(tmp_path: Path) -> None:
    """transformers renders with trim_blocks and lstrip_blocks: the newline after a block tag
    ({% ... %}) and the indentation before it are dropped; lines of expressions ({{ ... }})
    keep both."""
    template = ("{% for message in messages %}\n"
                "  {{ '<|im_start|>' + message['role'] + '\\n' + message['content'] }}"
                "{{ '<|im_end|>\\n' }}\n"
                "{% endfor %}\n"
                "  {% if add_generation_prompt %}\n"
                "{{ '<|im_start|>assistant\\n' }}\n"
                "{% endif %}\n")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    rendered = ChatTemplates().for_model(model_in(tmp_path)).render(
        [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
    assert rendered == ("  <|im_start|>system\ns<|im_end|>\n\n  <|im_start|>user\nu<|im_end|>\n"
                        "\n<|im_start|>assistant\n\n")


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False)
    | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["role", "content", "type", "text", "tool_calls", "x"]), inner,
        max_size=4),
    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(model=st.none() | st.text(max_size=3), messages=_JSON, stream=_JSON,
       options=_JSON, max_tokens=_JSON)
def test_any_chat_body_is_read_or_refused_as_a_bad_request(
        model: Any, messages: Any, stream: Any, options: Any, max_tokens: Any) -> None:
    """Whatever shapes a chat's fields take, reading it gives parameters and a list of
    messages with string contents, or an OpenAI 400; never another exception."""
    body = orjson.dumps({"model": model, "messages": messages, "stream": stream,
                         "stream_options": options, "max_tokens": max_tokens})
    try:
        params, found = read_body(body, chat=True)
    except OpenAIError as exc:
        assert exc.status == 400
        return
    assert isinstance(params.model, str) and isinstance(found, list)
    assert all(isinstance(message["content"], str) for message in found)
