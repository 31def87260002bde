"""The JSON OpenAI answers with: whole completions, stream chunks, and the model list."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

# ``created`` of every model: tritium does not track when each was loaded.
STARTED = int(time.time())
OWNER = "tritium"
DONE_EVENT = b"data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def model_object(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": STARTED, "owned_by": OWNER}


@dataclass(slots=True)
class Reply:
    """One answer's identity (id, model, time) and its shapes, for completions or chat."""

    model: str
    chat: bool
    include_usage: bool = False
    created: int = field(default_factory=lambda: int(time.time()))
    id: str = ""

    def __post_init__(self) -> None:
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + secrets.token_hex(12)

    def _head(self, object_: str) -> dict[str, Any]:
        return {"id": self.id, "object": object_, "created": self.created, "model": self.model}

    def whole(self, text: str, finish_reason: str, usage: dict[str, int] | None) -> bytes:
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant",
                                                              "content": text}}
        else:
            choice = {"index": 0, "text": text}
        choice.update(logprobs=None, finish_reason=finish_reason)
        doc = self._head("chat.completion" if self.chat else "text_completion")
        doc.update(choices=[choice], usage=usage)
        return orjson.dumps(doc)

    def chunk(self, text: str | None, finish_reason: str | None = None,
              role: bool = False) -> bytes:
        """One stream event: a piece of text, the assistant's role (chat's first event),
        or the end (``finish_reason``, no text)."""
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": 0, "delta": delta}
        else:
            choice = {"index": 0, "text": text or ""}
        choice.update(logprobs=None, finish_reason=finish_reason)
        doc = self._head("chat.completion.chunk" if self.chat else "text_completion")
        doc["choices"] = [choice]
        if self.include_usage:  # every chunk but the last says it has none
            doc["usage"] = None
        return sse(doc)

    def usage_chunk(self, usage: dict[str, int] | None) -> bytes:
        doc = self._head("chat.completion.chunk" if self.chat else "text_completion")
        doc.update(choices=[], usage=usage)
        return sse(doc)
