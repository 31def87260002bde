"""What a model name may be: one path component, and a name Triton's python backend accepts."""

from __future__ import annotations

import re

from tritium.core.errors import ErrorCode, TritiumError

# A name becomes a directory name (NAME_MAX on Linux and macOS) and a log field.
MAX_NAME_BYTES = 255
# Triton's python backend refuses a stub (instance) name holding any of these, and a
# stub name is the model name plus a suffix.
STUB_INVALID_CHARS = ";|&$`<>()[]{}\\\"'*?~#!"
_SHOWN_CHARS = 64

# One search finds every character refused anywhere in a name; what it found picks the
# message. Control characters (NUL included) would cut or forge paths and log lines.
_REFUSED = re.compile("[\x00-\x1f\x7f/" + re.escape(STUB_INVALID_CHARS) + "]")
_PATH_CHARS = frozenset("/\\")
# Joins a model's name and its namespace (its repository) into the key of a model whose
# name other repositories share (``--model-namespacing``): '/' is in no model name, so a
# key is never a name a request could use.
NAMESPACE_SEPARATOR = "/"


def check_model_name(name: str) -> str:
    """Return ``name`` when it can name a model; raise INVALID_ARG saying why it cannot."""
    problem = model_name_problem(name)
    if problem:
        raise TritiumError(ErrorCode.INVALID_ARG, problem)
    return name


def model_name_problem(name: str) -> str:
    """Why ``name`` cannot name a model, or "" when it can."""
    # Length first: a name of megabytes (gRPC allows it) is refused without scanning it.
    if len(name) > MAX_NAME_BYTES or (not name.isascii() and _utf8_size(name) > MAX_NAME_BYTES):
        return (f"invalid model name '{shown(name)}', a model name is at most "
                f"{MAX_NAME_BYTES} bytes in UTF-8")
    if not name.strip():
        # Triton's own words for a load of an empty or blank name.
        return "Model name cannot be empty. Please enter a valid name to deploy."
    found = _REFUSED.search(name)
    if found is not None:
        return f"invalid model name '{shown(name)}', {_character_problem(found.group())}"
    if name in (".", ".."):
        return f"invalid model name '{name}', {_TRAVERSAL}"
    if name.startswith("."):
        return f"invalid model name '{shown(name)}', a model name must not start with '.'"
    return ""


def shown(text: str) -> str:
    """``text`` fit for an error message: control characters escaped, long text cut."""
    cut = text[:_SHOWN_CHARS]
    if not cut.isprintable():
        cut = "".join(c if c.isprintable() else repr(c)[1:-1] for c in cut)
    return cut + "..." if len(text) > _SHOWN_CHARS else cut


_TRAVERSAL = "model name must not contain path traversal characters"
# The python backend's words for a stub name with a refused character (clients match them).
_STUB_REFUSED = "Invalid stub name: contains invalid characters"


def _character_problem(char: str) -> str:
    if char == "/":
        return _TRAVERSAL
    if char in _PATH_CHARS:  # a backslash: the python backend refuses it too
        return f"{_TRAVERSAL}; {_STUB_REFUSED}"
    if char < " " or char == "\x7f":
        return "a model name must not contain control characters"
    return f"{_STUB_REFUSED}; a model name must not contain any of {STUB_INVALID_CHARS}"


def _utf8_size(name: str) -> int:
    return len(name.encode("utf-8", "surrogatepass"))


def qualified(name: str, namespace: str) -> str:
    """The key of model ``name`` of repository ``namespace``."""
    return f"{name}{NAMESPACE_SEPARATOR}{namespace}"


def plain_name(key: str) -> str:
    """The model name a key stands for."""
    return key.partition(NAMESPACE_SEPARATOR)[0]
