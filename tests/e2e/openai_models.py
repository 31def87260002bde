"""The repository and server the OpenAI tests share: text models (tests/models/text_words.py),
the example llm (BLS, with a chat template) and token_engine (decoupled), and a model that is
not a text model."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.server_process import TritiumProcess
from tests.zoo import DECOUPLED, EXAMPLES, _parameter, _tensor, add_model

# A Hugging Face style template: every message tagged with its role, then the assistant's
# tag when a generation prompt is asked for.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '[' + message['role'] + '] ' + message['content'] + ' ' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '[assistant]' }}{% endif %}"
)
TEXT_IO = (_tensor("input", "text_input", "BYTES", "1")
           + _tensor("input", "max_tokens", "INT32", "1", " optional: true")
           + _tensor("output", "text_output", "BYTES", "1")
           + _tensor("output", "num_input_tokens", "UINT32", "1")
           + _tensor("output", "num_output_tokens", "UINT32", "1"))
# Every field the mapping may pass, each in a type of the model's choosing.
SAMPLING_IO = (_tensor("input", "stream", "BOOL", "1", " optional: true")
               + _tensor("input", "temperature", "FP32", "1", " optional: true")
               + _tensor("input", "top_p", "FP64", "1", " optional: true")
               + _tensor("input", "seed", "UINT64", "1", " optional: true")
               + _tensor("input", "stop_words", "BYTES", "-1", " optional: true"))
RECORD_FILE = "text.jsonl"


def build_openai_repository(repo: Path, record_dir: Path) -> Path:
    record = _parameter("record_file", str(record_dir / RECORD_FILE))
    add_model(repo, "text_echo", "text_words",
              TEXT_IO + SAMPLING_IO + _parameter("mode", "echo"))
    add_model(repo, "text_echo_batched", "text_words",
              "max_batch_size: 4\n" + TEXT_IO + SAMPLING_IO + _parameter("mode", "echo"))
    add_model(repo, "text_words", "text_words", TEXT_IO + record)
    add_model(repo, "text_stream", "text_words", DECOUPLED + TEXT_IO + record)
    add_model(repo, "text_queue", "text_words",
              "max_batch_size: 1\ndynamic_batching { default_queue_policy { max_queue_size: 1 } }\n"
              + TEXT_IO + record)
    add_model(repo, "identity_fp32", "identity",
              _tensor("input", "INPUT0", "FP32", "-1") + _tensor("output", "OUTPUT0", "FP32", "-1"))
    for name in ("llm", "token_engine"):
        shutil.copytree(EXAMPLES / name, repo / name)
    tokenizer = json.dumps(
        {"chat_template": CHAT_TEMPLATE, "bos_token": {"content": "<s>"}, "eos_token": "</s>"})
    for name in ("llm", "text_words", "text_stream"):
        (repo / name / "tokenizer_config.json").write_text(tokenizer)
    for name in ("llm", "token_engine"):
        word_tokenizer().save(str(repo / name / "tokenizer.json"))
    return repo


def word_tokenizer() -> Any:
    """A tokenizer.json of a few words: whitespace and punctuation split, a BOS token put
    before a text encoded with its special tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"[UNK]": 0, "[BOS]": 1, "one": 2, "two": 3, "user": 4}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[BOS] $A", special_tokens=[("[BOS]", 1)])
    return tokenizer


@pytest.fixture(scope="module")
def openai_records(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("openai_records")


@pytest.fixture(scope="module")
def openai_server(tmp_path_factory: pytest.TempPathFactory, openai_records: Path
                  ) -> Iterator[TritiumProcess]:
    repo = build_openai_repository(tmp_path_factory.mktemp("openai_repo"), openai_records)
    process = TritiumProcess(repo).start()
    yield process
    code = process.stop()
    assert code == 0, process.log()


def base_url(server: TritiumProcess) -> str:
    return f"http://{server.http_url}/v1"


@pytest.fixture
def client(openai_server: TritiumProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=base_url(openai_server), api_key="unused", max_retries=0,
                       timeout=60) as made:
        yield made
