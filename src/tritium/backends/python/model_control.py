"""pb_utils.load_model, unload_model and is_model_ready: the server's model control,
called from model code.

They are the repository API a client reaches with ``POST /v2/repository/models/<name>/load``,
so the same restriction holds: loading and unloading need ``--model-control-mode=explicit``.
Model code runs on an instance thread (or its own event loop), never on the server loop;
each call waits there for the server loop to do the work, as Triton's stub waits for the
parent process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from tritium.backends.python import scope
from tritium.backends.python.errors import TritonModelException
from tritium.backends.python.link import ServerLink
from tritium.core.errors import TritiumError

T = TypeVar("T")

_LOAD_FAILED = "Failed to load model: "
_UNLOAD_FAILED = "Failed to unload model: "
_READINESS_FAILED = "Failed to check model readiness: "


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) ``model_name``, optionally with a JSON config and override files."""
    name = _text("model_name", model_name)
    parameters: dict[str, Any] = {}
    if _text("config", config):
        parameters["config"] = config
    if files is not None:
        parameters.update(_file_parameters(name, files))
    _call(_LOAD_FAILED, lambda link: link.load_model(name, parameters))


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Take ``model_name`` out of service; returns without waiting for it to drain."""
    name = _text("model_name", model_name)
    if not isinstance(unload_dependents, bool):
        raise TypeError("unload_dependents must be a bool")
    # Triton's "dependents" of an ensemble are its composing models loaded only for it.
    parameters = {"unload_dependents": True} if unload_dependents else {}
    _call(_UNLOAD_FAILED, lambda link: link.unload_model(name, parameters))


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether ``model_name`` (the version the policy picks, or ``model_version``) is READY.

    As in Triton, a model the server cannot resolve raises instead of answering False.
    """
    name = _text("model_name", model_name)
    version = _version(_text("model_version", model_version))
    return bool(_call(_READINESS_FAILED, lambda link: link.is_model_ready(name, version)))


def _text(argument: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{argument} must be a str, found '{type(value).__name__}'")
    return value


def _file_parameters(name: str, files: Any) -> dict[str, bytes]:
    if not isinstance(files, dict) or not all(
        isinstance(key, str) and isinstance(value, (bytes, bytearray))
        for key, value in files.items()
    ):
        raise TritonModelException(
            f"failed to load model '{name}', files should be a dictionary of file paths "
            "and file contents"
        )
    return {key: bytes(value) for key, value in files.items()}


def _version(text: str) -> int | None:
    """Triton's reading of a version string: empty picks by policy, else an integer >= 0."""
    if not text:
        return None
    try:
        version = int(text)
    except ValueError as exc:
        raise TritonModelException(
            f"{_READINESS_FAILED}failed to get model version from specified version string "
            f"'{text}' (details: {exc}), version should be an integral value > 0"
        ) from None
    if version < 0:
        raise TritonModelException(
            f"{_READINESS_FAILED}failed to get model version from specified version string "
            f"'{text}', version should be an integral value > 0"
        )
    return version


def _check_phase(prefix: str) -> None:
    if scope.current_phase() in (scope.Phase.AUTO_COMPLETE, scope.Phase.FINALIZE):
        raise TritonModelException(
            f"{prefix}the model loading API is not supported during the "
            "'auto_complete_config' and 'finalize' functions"
        )


def _call(prefix: str, work: Callable[[ServerLink], T]) -> T:
    """``work`` on the server link, its refusal raised with Triton's ``prefix``."""
    _check_phase(prefix)
    link = scope.current_link()
    if link is None:
        raise TritonModelException(f"{prefix}the model loading API needs a running server")
    try:
        return work(link)
    except TritiumError as exc:
        raise TritonModelException(prefix + exc.message) from None

