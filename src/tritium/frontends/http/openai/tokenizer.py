"""Token counts for ``usage`` from the model's Hugging Face ``tokenizer.json``, for models
that do not report their own (num_input_tokens / num_output_tokens). Optional: without the
``tokenizers`` package, or without the file, usage is what the model reports."""

from __future__ import annotations

import importlib.util
import logging
import threading
from pathlib import Path
from typing import Any

from tritium.core import offload
from tritium.core.model import ModelHandle

log = logging.getLogger("tritium.http")

TOKENIZER_FILE = "tokenizer.json"

# The optional extra (tokenizers): without it, usage is what the model reports.
AVAILABLE = importlib.util.find_spec("tokenizers") is not None


class Tokenizers:
    """Each model's tokenizer, loaded once per change of its file."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[Path, tuple[int, Any]] = {}

    def for_model(self, model: ModelHandle, fallback: Path | None = None) -> Any | None:
        """The tokenizer in the model's directory, else in ``fallback`` (--tokenizer)."""
        if not AVAILABLE:
            return None
        # The repository's models know their directory; the core's interface does not
        # promise one (see chat.ChatTemplates).
        directory = getattr(model, "model_dir", None)
        for place in (directory, fallback):
            if place is not None and (Path(place) / TOKENIZER_FILE).is_file():
                return self._load(Path(place) / TOKENIZER_FILE)
        return None

    def _load(self, path: Path) -> Any | None:
        try:
            stamp = path.stat().st_mtime_ns
        except OSError:
            return None
        with self._lock:
            cached = self._cache.get(path)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            tokenizer = _read(path)
        except Exception as exc:  # a broken file costs usage counts, never the request
            log.warning("cannot read tokenizer %s: %s", path, exc)
            tokenizer = None
        with self._lock:
            self._cache[path] = (stamp, tokenizer)
        return tokenizer


def _read(path: Path) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


async def count_tokens(tokenizer: Any, text: str, special: bool) -> int:
    """Tokens of ``text`` (with the tokenizer's special tokens when ``special``), counted on
    a codec thread when the text is long."""
    if offload.heavy(len(text)):
        return await offload.run(_count, tokenizer, text, special)
    return _count(tokenizer, text, special)


def _count(tokenizer: Any, text: str, special: bool) -> int:
    return len(tokenizer.encode(text, add_special_tokens=special).ids)
