"""A load request's overrides: a ``config`` in JSON form and ``file:<path>`` model files.

Everything a request sends is checked before one byte reaches the disk; the files then go
into a fresh private directory that only the server can read, removed with the model.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.names import check_model_name, shown
from tritium.repository.config import json_to_config

log = logging.getLogger("tritium.repository")

FILE_PREFIX = "file:"
DIR_PREFIX = "tritium-override-"


@dataclass(frozen=True, slots=True)
class OverrideLimits:
    """How much one load may upload; the defaults fit any real python model."""

    max_files: int = 1024
    max_total_bytes: int = 256 * 1024 * 1024  # decoded content of all files together
    max_path_bytes: int = 1024  # one relative path, in UTF-8
    max_depth: int = 32  # directories and file name, e.g. "1/model.py" is 2
    max_component_bytes: int = 255  # one directory or file name (NAME_MAX)


DEFAULT_LIMITS = OverrideLimits()


@dataclass(slots=True)
class LoadOverrides:
    """What a load request replaces: the config, and the whole model directory."""

    config: Any = None  # a ModelConfig, or None: read the repository's config.pbtxt
    files: dict[str, bytes] | None = None  # normalized relative path → content

    @property
    def empty(self) -> bool:
        return self.config is None and not self.files


def parse_overrides(name: str, parameters: Mapping[str, Any],
                    limits: OverrideLimits = DEFAULT_LIMITS) -> LoadOverrides:
    """Decode a load request's parameters; raises INVALID_ARG on anything malformed.

    Other parameters (``unload_dependents``, vendor keys) are ignored, as Triton does.
    """
    if not isinstance(parameters, Mapping):
        raise _invalid(name, "the load parameters must be an object of name: value")
    overrides = LoadOverrides()
    config = parameters.get("config")
    if config is not None:
        if not isinstance(config, str):
            raise _invalid(name, "the 'config' parameter must be a JSON string")
        overrides.config = json_to_config(config)
    raw = {key: value for key, value in parameters.items() if key.startswith(FILE_PREFIX)}
    if raw:
        if overrides.config is None:
            raise _invalid(name, "Load parameter 'config' must be specified for model file "
                                 "override")
        overrides.files = _decode_files(name, raw, limits)
    return overrides


def _decode_files(name: str, raw: Mapping[str, Any], limits: OverrideLimits
                  ) -> dict[str, bytes]:
    if len(raw) > limits.max_files:
        raise _invalid(name, f"{len(raw)} file overrides, more than the {limits.max_files} "
                             "one load may carry")
    paths = {key: override_path(name, key, limits) for key in raw}
    _check_layout(name, paths)
    # The sizes are known before decoding anything: base64 text is 4/3 of its content.
    total = sum(_decoded_size(name, key, value) for key, value in raw.items())
    if total > limits.max_total_bytes:
        raise _invalid(name, f"file overrides hold {total} bytes, more than the "
                             f"{limits.max_total_bytes} one load may carry")
    return {paths[key]: _content(name, key, value) for key, value in raw.items()}


def override_path(name: str, key: str, limits: OverrideLimits = DEFAULT_LIMITS) -> str:
    """The normalized relative path a ``file:<path>`` key names; INVALID_ARG unless it is
    plainly inside the model directory (Triton also refuses what would leave it).

    Leading slashes are dropped: Triton joins the key onto the model directory and
    canonicalizes, so ``file:/1/model.py`` (as its own tests send) is ``1/model.py`` there.
    """
    path = key[len(FILE_PREFIX):].lstrip("/")
    problem = _path_problem(path, limits)
    if problem:
        raise _invalid(name, f"invalid file override path in parameter '{shown(key)}': "
                             f"{problem}")
    return str(PurePosixPath(path))


def _path_problem(path: str, limits: OverrideLimits) -> str:
    size = len(path.encode("utf-8", "surrogatepass"))
    if size > limits.max_path_bytes:
        return f"the path is {size} bytes long, more than {limits.max_path_bytes}"
    if any(c < " " or c == "\x7f" for c in path):
        return "the path holds a control character (NUL included)"
    if "\\" in path:
        return "the path holds a backslash; use '/' between directories"
    parts = PurePosixPath(path).parts
    if not parts:
        return "the path names no file"
    if ".." in parts:
        return "the path must stay within the model directory ('..')"
    if len(parts) > limits.max_depth:
        return f"the path is {len(parts)} levels deep, more than {limits.max_depth}"
    longest = max(len(part.encode("utf-8", "surrogatepass")) for part in parts)
    if longest > limits.max_component_bytes:
        return f"a path component is {longest} bytes long, more than " \
               f"{limits.max_component_bytes}"
    return ""


def _check_layout(name: str, paths: Mapping[str, str]) -> None:
    """Two keys for one file, or a file where another key needs a directory, are refused:
    written in turn, one would silently replace or break the other."""
    files: dict[str, str] = {}
    for key, path in paths.items():
        if path in files:
            raise _invalid(name, f"parameters '{shown(files[path])}' and '{shown(key)}' "
                                 "name the same file")
        files[path] = key
    for key, path in paths.items():
        for parent in PurePosixPath(path).parents:
            if str(parent) in files:
                raise _invalid(name, f"Invalid file parameter '{shown(key)}', directory has "
                                     "been created as a file")


def _decoded_size(name: str, key: str, value: Any) -> int:
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, str):
        return len(value) * 3 // 4
    raise _invalid(name, f"parameter '{shown(key)}' must hold the file's bytes "
                         "(base64 text over HTTP, bytes_param over gRPC)")


def _content(name: str, key: str, value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    try:  # HTTP/JSON carries file content as base64
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise _invalid(name, f"parameter '{shown(key)}' is not valid base64") from None


class OverrideDir:
    """A private directory holding one load's model files; ``model_dir`` is the model."""

    def __init__(self, root: Path, model_dir: Path):
        self.root = root
        self.model_dir = model_dir

    @classmethod
    def write(cls, name: str, files: Mapping[str, bytes]) -> OverrideDir:
        """Write ``files`` (paths from ``parse_overrides``) under a new private directory;
        on any error nothing is left behind."""
        check_model_name(name)
        # Mode 0700, a name never reused; the pid in it lets a later server sweep it up
        # should this one be killed before it could remove it.
        root = Path(tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-"))
        holder = cls(root, root / name)
        try:
            holder.model_dir.mkdir(mode=0o700)
            for relative, content in files.items():
                _write_file(holder.model_dir, relative, content)
        except BaseException:
            holder.remove()
            raise
        return holder

    def remove(self) -> None:
        """Delete the directory and everything in it; safe to call more than once."""
        try:
            shutil.rmtree(self.root)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.error("cannot remove model override directory %s: %s", self.root, exc)


def sweep_stale_dirs(parent: Path | None = None) -> int:
    """Remove the override directories of servers that died without removing them (a
    SIGKILL): this user's, named for a process that no longer exists. Returns how many."""
    parent = Path(parent or tempfile.gettempdir())
    removed = 0
    try:
        candidates = list(parent.glob(f"{DIR_PREFIX}*-*"))
    except OSError:
        return 0
    for path in candidates:
        pid = path.name[len(DIR_PREFIX):].split("-", 1)[0]
        try:
            info = path.lstat()
        except OSError:
            continue
        if not pid.isdigit() or _alive(int(pid)) or info.st_uid != os.geteuid() \
                or not path.is_dir() or path.is_symlink():
            continue
        OverrideDir(path, path).remove()
        removed += 1
    if removed:
        log.info("removed %d model override directories left by servers that died", removed)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process: alive, and not ours to judge
    return True


def _write_file(model_dir: Path, relative: str, content: bytes) -> None:
    target = model_dir / relative
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # O_EXCL and O_NOFOLLOW: the directory is ours and fresh, so any existing entry or link
    # at the target means something went wrong; refuse rather than write through it.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(target, flags, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(content)


def _invalid(name: str, detail: str) -> TritiumError:
    return TritiumError(ErrorCode.INVALID_ARG, f"failed to load '{shown(name)}': {detail}")
