"""Attacks on /v1/chat/completions: a huge chat is refused from a scan of its bytes, off the
event loop, while other clients are served; a template that fails on a client's messages is
that client's 400, never a server error."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.e2e.bystander import Bystander, health_url, peak_rss_bytes
from tests.e2e.openai_models import TEXT_IO, base_url
from tests.server_process import TritiumProcess
from tests.zoo import _parameter, add_model

MIB = 1 << 20
TEMPLATE = ("{% for m in messages %}{{ '[' + m['role'] + '] ' + m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}[assistant]{% endif %}")
# Templates that fail on what a client sends, each with an exception that is not jinja's
# TemplateError.
FAILING = {
    # tool_calls of the wrong shape in an ordinary template: TypeError.
    "tools": "{% for m in messages %}{% for c in m['tool_calls'] %}{{ c['function']['name'] }}"
             "{% endfor %}{% endfor %}",
    # The sandbox's bound on range(): OverflowError.
    "ranges": "{% for i in range((messages | length) * 10**9) %}{% endfor %}",
    # An include with no loader to read it: TypeError.
    "includes": "{% include messages[0]['content'] %}",
    # A macro that never stops calling itself: RecursionError.
    "recursion": "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(messages) }}",
}


def add_text_model(repo: Path, name: str, template: str) -> None:
    add_model(repo, name, "text_words", TEXT_IO + _parameter("mode", "echo"))
    (repo / name / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritiumProcess]:
    repo = tmp_path_factory.mktemp("openai_limits")
    add_text_model(repo, "chat", TEMPLATE)
    for name, template in FAILING.items():
        add_text_model(repo, name, template)
    process = TritiumProcess(repo).start()
    yield process
    assert process.stop() == 0, process.log()


def chat(server: TritiumProcess, body: bytes | dict[str, Any]) -> requests.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return requests.post(f"{base_url(server)}/chat/completions", data=data,
                         headers={"Content-Type": "application/json"}, timeout=120)


def tiny_messages(model: str, count: int) -> bytes:
    message = b'{"role":"user","content":"a"}'
    return (b'{"model":"' + model.encode() + b'","messages":['
            + b",".join([message] * count) + b"]}")


@pytest.mark.parametrize("model", ["no_such_model", "chat"])
def test_millions_of_tiny_messages_are_refused_without_stalling_anyone(
        server: TritiumProcess, model: str) -> None:
    """A 31 MiB body of a million messages (it once held the event loop 12 to 38 s and took
    2.7 GiB) is refused 400 from a scan of its bytes: no message is built, the server's
    peak memory grows by little more than the body, and an unrelated client is served
    throughout."""
    body = tiny_messages(model, 1_000_000)
    assert len(body) > 28 * MIB
    before = peak_rss_bytes(server.pid)
    bystander = Bystander(health_url(server.http_url))
    with bystander.watching() as latencies:
        reply = chat(server, body)
    bystander.close()
    assert reply.status_code == 400, reply.text
    assert "too many JSON values" in reply.json()["error"]["message"]
    bystander.assert_served(latencies)
    assert peak_rss_bytes(server.pid) - before < 4 * len(body)


def test_a_chat_of_more_messages_than_allowed_is_refused(server: TritiumProcess) -> None:
    reply = chat(server, tiny_messages("chat", 16_385))
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "messages"
    assert "at most 16384 messages" in reply.json()["error"]["message"]


def test_a_long_chat_is_rendered_off_the_loop(server: TritiumProcess) -> None:
    """The most messages allowed, rendered on a codec thread: answered, others served."""
    bystander = Bystander(health_url(server.http_url))
    with bystander.watching() as latencies:
        reply = chat(server, tiny_messages("chat", 16_384))
    bystander.close()
    assert reply.status_code == 200, reply.text
    prompt = json.loads(reply.json()["choices"][0]["message"]["content"])
    assert prompt["text_input"]["values"] == ["[user] a" * 16_384 + "[assistant]"]
    bystander.assert_served(latencies)


@pytest.mark.parametrize(("model", "messages", "reason"), [
    ("tools", [{"role": "assistant", "content": "", "tool_calls": 5}], "TypeError"),
    ("ranges", [{"role": "user", "content": "x"}], "OverflowError"),
    ("includes", [{"role": "user", "content": "/etc/passwd"}], "TypeError"),
    ("recursion", [{"role": "user", "content": "x"}], "RecursionError"),
])
def test_a_template_failing_on_the_messages_is_a_bad_request(
        server: TritiumProcess, model: str, messages: list[dict[str, Any]],
        reason: str) -> None:
    start = len(server.lines)
    reply = chat(server, {"model": model, "messages": messages})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "messages" and reason in error["message"]
    assert "Traceback" not in "\n".join(server.lines[start:])
    assert chat(server, {"model": "chat", "messages": [{"role": "u", "content": "x"}]}
                ).status_code == 200
