"""Chat messages to a prompt with the model's Hugging Face chat template, rendered as
``transformers``' ``apply_chat_template`` renders it: a sandboxed jinja2 environment that
trims blocks, ``raise_exception`` and ``strftime_now`` available, the special tokens of the
tokenizer config as variables."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tritium.core.model import ModelHandle
from tritium.frontends.http.openai.errors import OpenAIError, bad_param

TOKENIZER_CONFIG = "tokenizer_config.json"
# Messages in one chat request: longer conversations than any model's context holds, and a
# bound on the work of copying and rendering them (a few tens of milliseconds).
MAX_MESSAGES = 16_384
# Newer tokenizers save their template beside the config, in a file of its own.
TEMPLATE_FILE = "chat_template.jinja"


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    template: jinja2.Template
    tokens: dict[str, str]  # bos_token, eos_token, ...: variables of the template

    def render(self, messages: list[dict[str, Any]]) -> str:
        try:
            return self.template.render(messages=messages, add_generation_prompt=True,
                                        **self.tokens)
        # Whatever a template raises, it raised on the messages this client sent (a
        # tool_calls of the wrong shape is a TypeError in an ordinary template; the
        # sandbox's range bound an OverflowError): their error, answered 400.
        except Exception as exc:
            reason = str(exc) if isinstance(exc, jinja2.TemplateError) \
                else f"{type(exc).__name__}: {exc}"
            raise bad_param("messages", f"the model's chat template refused the messages: "
                                        f"{reason}") from None


def messages_of(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``messages`` of a chat request, each content made one string (text parts
    joined) as templates expect."""
    messages = doc.get("messages")
    if type(messages) is not list or not messages:
        raise bad_param("messages", "'messages' must be a non-empty list")
    if len(messages) > MAX_MESSAGES:
        raise bad_param("messages", f"'messages' may hold at most {MAX_MESSAGES} messages, "
                                    f"not {len(messages)}")
    result = []
    for index, message in enumerate(messages):
        if type(message) is not dict or type(message.get("role")) is not str:
            raise bad_param(f"messages.[{index}]", "each message must be an object with a "
                                                   "string 'role'")
        result.append({**message, "content": _content(message.get("content"), index)})
    return result


def _content(content: Any, index: int) -> str:
    if content is None or type(content) is str:
        return content or ""
    if type(content) is list:
        parts = []
        for part in content:
            if type(part) is not dict or part.get("type") != "text" \
                    or type(part.get("text")) is not str:
                raise bad_param(f"messages.[{index}].content",
                                "only text content parts are supported")
            parts.append(part["text"])
        return "".join(parts)
    raise bad_param(f"messages.[{index}].content", "content must be a string or a list of "
                                                   "text parts")


class ChatTemplates:
    """Each model's template, read from its directory and compiled once per change of
    the files."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[Path, tuple[tuple[int, ...], ChatTemplate | None]] = {}

    def for_model(self, model: ModelHandle, fallback: Path | None = None) -> ChatTemplate:
        """The template in the model's directory, else in ``fallback`` (--tokenizer)."""
        # The repository's models know their directory; the core's interface does not
        # promise one, so a model without it has only the fallback.
        directory = getattr(model, "model_dir", None)
        found = self._load(Path(directory)) if directory is not None else None
        if found is None and fallback is not None:
            found = self._load(fallback)
        if found is None:
            raise OpenAIError(
                400, f"no chat template was found for model '{model.name}': put a Hugging "
                     f"Face {TOKENIZER_CONFIG} with a 'chat_template' in its directory",
                param="model", code="no_chat_template")
        return found

    def _load(self, directory: Path) -> ChatTemplate | None:
        files = (directory / TOKENIZER_CONFIG, directory / TEMPLATE_FILE)
        stamp = tuple(_mtime(path) for path in files)
        with self._lock:
            cached = self._cache.get(directory)
            if cached is not None and cached[0] == stamp:
                return cached[1]
        template = _read_template(*files)
        with self._lock:
            self._cache[directory] = (stamp, template)
        return template


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return -1


def _read_template(config_path: Path, template_path: Path) -> ChatTemplate | None:
    config = _read_json(config_path)
    source: Any = config.get("chat_template")
    if template_path.is_file():
        source = template_path.read_text()
    if type(source) is list:  # named templates: the "default" one serves chat
        source = next((t.get("template") for t in source
                       if type(t) is dict and t.get("name") == "default"), None)
    if type(source) is not str or not source:
        return None
    try:
        template = _environment().from_string(source)
    except jinja2.TemplateError as exc:
        raise OpenAIError(500, f"the chat template in {config_path.parent} does not compile: "
                               f"{exc}", "server_error") from None
    return ChatTemplate(template, _special_tokens(config))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if type(value) is dict else {}


def _special_tokens(config: dict[str, Any]) -> dict[str, str]:
    """bos_token, eos_token and the like; a token saved as an AddedToken object is its
    ``content``."""
    tokens = {}
    for key, value in config.items():
        if not key.endswith("_token"):
            continue
        if type(value) is dict:
            value = value.get("content")
        if type(value) is str:
            tokens[key] = value
    return tokens


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.TemplateError(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    # Unlike jinja2's own tojson, HF's does not escape HTML characters.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _environment() -> jinja2.Environment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env
