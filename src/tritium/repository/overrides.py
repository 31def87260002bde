"""A load request's overrides: a ``config`` in JSON form and ``file:<path>`` model files."""

from __future__ import annotations

import base64
import binascii
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from tritium.core.errors import ErrorCode, TritiumError
from tritium.repository.config import json_to_config

FILE_PREFIX = "file:"


@dataclass(slots=True)
class LoadOverrides:
    """What a load request replaces: the config, and the whole model directory."""

    config: Any = None  # a ModelConfig, or None: read the repository's config.pbtxt
    files: dict[str, bytes] | None = None  # relative path → content

    @property
    def empty(self) -> bool:
        return self.config is None and not self.files


def parse_overrides(name: str, parameters: Mapping[str, Any]) -> LoadOverrides:
    """Decode a load request's parameters; raises INVALID_ARG on anything malformed.

    Other parameters (``unload_dependents``, vendor keys) are ignored, as Triton does.
    """
    overrides = LoadOverrides()
    files: dict[str, bytes] = {}
    for key, value in parameters.items():
        if key == "config":
            if not isinstance(value, str):
                raise _invalid(name, "the 'config' parameter must be a JSON string")
            overrides.config = json_to_config(value)
        elif key.startswith(FILE_PREFIX):
            files[_relative_path(name, key[len(FILE_PREFIX):])] = _content(name, key, value)
    if files:
        if overrides.config is None:
            raise _invalid(name, "file overrides need a 'config' parameter as well")
        overrides.files = files
    return overrides


def write_model_dir(name: str, files: Mapping[str, bytes]) -> tempfile.TemporaryDirectory[str]:
    """Write override files as a model directory named ``name`` inside a new temporary
    directory; the model directory is ``Path(result.name) / name``."""
    holder = tempfile.TemporaryDirectory(prefix="tritium-override-")
    model_dir = Path(holder.name) / name
    for relative, content in files.items():
        target = model_dir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    model_dir.mkdir(exist_ok=True)
    return holder


def _relative_path(name: str, path: str) -> str:
    parts = PurePosixPath(path).parts
    # The files land in a directory of our making: nothing may point outside it.
    if not parts or path.startswith("/") or ".." in parts or "\\" in path:
        raise _invalid(name, f"invalid file override path '{path}'")
    return str(PurePosixPath(*parts))


def _content(name: str, key: str, value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):  # HTTP/JSON carries file content as base64
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise _invalid(name, f"parameter '{key}' is not valid base64") from None
    raise _invalid(name, f"parameter '{key}' must hold the file's bytes")


def _invalid(name: str, detail: str) -> TritiumError:
    return TritiumError(ErrorCode.INVALID_ARG, f"failed to load '{name}': {detail}")
