"""What an OpenAI completion or chat request asks for, checked the way OpenAI checks it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tritium.frontends.http import json_pieces
from tritium.frontends.http.openai.errors import OpenAIError, bad_param

# Brackets and commas (outside strings) a request body may hold: about a million values, a
# few hundred MiB as Python objects. A 55 MiB body of millions of tiny messages is refused
# by a scan of its bytes, before any of them is built.
MAX_JSON_TOKENS = 1 << 20

Number = int | float
# OpenAI's sampling fields with the range OpenAI accepts; each reaches a model only when
# it declares an input of that name.
_RANGES: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "frequency_penalty": (-2.0, 2.0),
    "presence_penalty": (-2.0, 2.0),
}


@dataclass(slots=True)
class Params:
    """The fields of a request that tritium acts on; the rest are ignored, as OpenAI-
    compatible servers do with fields their engine has no use for."""

    model: str
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    # OpenAI field name -> value (stop as a list of strings), unset fields left out.
    sampling: dict[str, Any] = field(default_factory=dict)


def parse_body(body: bytes | memoryview) -> dict[str, Any]:
    """The request's JSON object; a body larger than a piece is parsed a piece at a time,
    so that, on a worker thread, it never holds the GIL for long."""
    try:
        doc = json_pieces.loads(body, max_tokens=MAX_JSON_TOKENS) if body else None
    except json_pieces.TooManyValues:
        raise OpenAIError(400, f"The request body holds too many JSON values (more than "
                               f"{MAX_JSON_TOKENS} brackets and commas)") from None
    except json_pieces.JsonError as exc:
        raise OpenAIError(400, f"We could not parse the JSON body of your request: {exc}"
                          ) from None
    if type(doc) is not dict:
        raise OpenAIError(400, "The request body must be a JSON object")
    return doc


def common_params(doc: dict[str, Any], token_fields: tuple[str, ...]) -> Params:
    """Model, streaming, token limit (the first of ``token_fields`` given) and sampling."""
    model = doc.get("model")
    if type(model) is not str or not model:
        raise bad_param("model", "you must provide a model parameter")
    params = Params(model=model, stream=_flag(doc, "stream"))
    options = doc.get("stream_options")
    if options is not None:
        if not params.stream:
            raise bad_param("stream_options",
                            "The 'stream_options' parameter is only allowed when 'stream' "
                            "is enabled.")
        if type(options) is not dict:
            raise bad_param("stream_options", "'stream_options' must be an object")
        params.include_usage = _flag(options, "include_usage")
    n = doc.get("n")
    if n is not None and n != 1:
        raise bad_param("n", "Only n=1 is supported")
    _refuse_unsupported(doc)
    for name in token_fields:
        if doc.get(name) is not None:
            params.max_tokens = _positive_int(doc, name)
            break
    params.sampling = _sampling(doc)
    return params


# Fields whose effect the generate convention cannot give, with the values that ask for
# nothing: any other value is refused rather than silently answered without it.
_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False), "top_logprobs": (None, 0), "echo": (None, False),
    "best_of": (None, 1), "suffix": (None, ""),
}


def _refuse_unsupported(doc: dict[str, Any]) -> None:
    for name, harmless in _UNSUPPORTED.items():
        value = doc.get(name)
        if not any(value is h or (type(value) is type(h) and value == h) for h in harmless):
            raise bad_param(name, f"'{name}' is not supported by this server")


def prompt_of(doc: dict[str, Any]) -> str:
    """A completion's prompt: a string, or a list holding one string."""
    prompt = doc.get("prompt")
    if type(prompt) is list and len(prompt) == 1:
        prompt = prompt[0]
    if type(prompt) is not str:
        raise bad_param("prompt", "'prompt' must be a string (or a list of one string)")
    return prompt


def _flag(doc: dict[str, Any], name: str) -> bool:
    value = doc.get(name, False)
    if value is None:
        return False
    if type(value) is not bool:
        raise bad_param(name, f"'{name}' must be a boolean")
    return value


def _positive_int(doc: dict[str, Any], name: str) -> int:
    value = doc[name]
    if type(value) is not int or value < 1:
        raise bad_param(name, f"'{name}' must be an integer of at least 1, not {value!r}")
    return value


def _sampling(doc: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, (low, high) in _RANGES.items():
        value = doc.get(name)
        if value is None:
            continue
        if type(value) not in (int, float) or not low <= value <= high:
            raise bad_param(name, f"'{name}' must be a number from {low:g} to {high:g}, "
                                  f"not {value!r}")
        found[name] = value
    seed = doc.get("seed")
    if seed is not None:
        if type(seed) is not int:
            raise bad_param("seed", f"'seed' must be an integer, not {seed!r}")
        found["seed"] = seed
    stop = doc.get("stop")
    if stop is not None:
        stops = [stop] if type(stop) is str else stop
        if type(stops) is not list or not all(type(s) is str for s in stops):
            raise bad_param("stop", "'stop' must be a string or a list of strings")
        if stops:
            found["stop"] = stops
    return found
