"""Imports a model.py, runs its auto_complete_config, and creates initialized instances."""

from __future__ import annotations

import os
import types
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tritium.backends.python import scope
from tritium.backends.python.backend import PythonBackend
from tritium.backends.python.errors import describe_exception
from tritium.backends.python.importer import forget_module, import_model_file
from tritium.backends.python.link import ServerLink
from tritium.backends.python.request import RequestContext
from tritium.core.errors import ErrorCode, TritiumError
from tritium.execution.backend import InstanceInfo

if TYPE_CHECKING:
    from pathlib import Path  # given by the server; an instance process does without it

DEFAULT_MODEL_FILENAME = "model.py"
MODEL_CLASS = "TritonPythonModel"


@dataclass(frozen=True, slots=True)
class Declared:
    """What the backend reads of a model's configuration."""

    filename: str
    outputs: list[str]
    decoupled: bool
    iterative: bool

    @classmethod
    def of(cls, config: Any) -> Declared:
        """From tritonclient's ModelConfig, or from its JSON form as a dict: what an
        instance process receives, so that it need not import protobuf."""
        if isinstance(config, dict):
            return cls(config.get("default_model_filename") or DEFAULT_MODEL_FILENAME,
                       [output["name"] for output in config.get("output", ())],
                       bool(config.get("model_transaction_policy", {}).get("decoupled")),
                       bool(config.get("sequence_batching", {}).get("iterative_sequence")))
        return cls(_model_filename(config), [output.name for output in config.output],
                   config.model_transaction_policy.decoupled,
                   config.sequence_batching.iterative_sequence)


def auto_complete_config(model_dir: Path, config: Any) -> Any:
    """Run the model's static ``auto_complete_config`` (if any) on a copy of ``config``, in
    this process (the instance builder runs it elsewhere for models it puts elsewhere).

    The model file is imported on its own for this and dropped afterwards: as in Triton,
    nothing created here survives into ``initialize``.
    """
    version_dir = _highest_version_dir(model_dir, _model_filename(config))
    module = import_model_file(version_dir / _model_filename(config))
    try:
        hook = getattr(_model_class(module, config.name), "auto_complete_config", None)
        if hook is None:
            return config
        return _run_auto_complete(hook, config, str(version_dir))
    finally:
        forget_module(module)


def create_python_backend(info: InstanceInfo, config: Any, link: ServerLink | None
                          ) -> PythonBackend:
    """Import model.py, create the TritonPythonModel and ``initialize`` it.

    Runs on the instance's own thread. Each instance imports the file afresh, so module
    globals are per instance, as they are in Triton's one-process-per-instance stubs.
    ``config`` is either form ``Declared.of`` reads.
    """
    if link is not None:
        scope.register_link(link)
    declared = Declared.of(config)
    version_dir = os.path.join(info.model_repository, str(info.model_version))
    module = import_model_file(os.path.join(version_dir, declared.filename))
    try:
        model = _model_class(module, info.model_name)()
        _initialize(model, _initialize_args(info), link, version_dir)
    except TritiumError:
        forget_module(module)
        raise
    except Exception as exc:
        forget_module(module)
        raise TritiumError(ErrorCode.INTERNAL, describe_exception(exc)) from exc
    context = RequestContext(declared.outputs, declared.decoupled, declared.iterative)
    return PythonBackend(model, info.model_name, version_dir, link, context, module,
                         instance_name=info.instance_name)


def _model_filename(config: Any) -> str:
    return config.default_model_filename or DEFAULT_MODEL_FILENAME


def _model_class(module: types.ModuleType, model_name: str) -> Any:
    model_class = getattr(module, MODEL_CLASS, None)
    if model_class is None:
        raise TritiumError(
            ErrorCode.INVALID_ARG,
            f"model '{model_name}': {module.__file__} does not define class '{MODEL_CLASS}'",
        )
    return model_class


def _highest_version_dir(model_dir: Path, filename: str) -> Path:
    versions = (
        [
            int(entry.name)
            for entry in model_dir.iterdir()
            if entry.is_dir() and entry.name.isdigit() and (entry / filename).is_file()
        ]
        if model_dir.is_dir()
        else []
    )
    if not versions:
        raise TritiumError(
            ErrorCode.INVALID_ARG, f"no version directory of '{model_dir}' contains {filename}"
        )
    return model_dir / str(max(versions))


def _run_auto_complete(hook: Any, config: Any, version_dir: str) -> Any:
    from tritium.backends.python.model_config import ModelConfig

    copy = type(config)()
    copy.CopyFrom(config)
    token = scope.enter(scope.ExecutionScope(None, version_dir,
                                             phase=scope.Phase.AUTO_COMPLETE))
    try:
        result = hook(ModelConfig(copy))
    except Exception as exc:
        raise TritiumError(
            ErrorCode.INVALID_ARG,
            f"auto_complete_config function in model '{config.name}' failed: "
            f"{describe_exception(exc)}",
        ) from exc
    finally:
        scope.leave(token)
    if not isinstance(result, ModelConfig):
        raise TritiumError(
            ErrorCode.INVALID_ARG,
            f"auto_complete_config function in model '{config.name}' must return a valid "
            "pb.ModelConfig object.",
        )
    return result.to_protobuf()


def _initialize_args(info: InstanceInfo) -> dict[str, str]:
    return {
        "model_config": info.config_json,
        "model_instance_kind": info.kind,
        "model_instance_name": info.instance_name,
        "model_instance_device_id": str(info.device_id),
        "model_repository": info.model_repository,
        "model_version": str(info.model_version),
        "model_name": info.model_name,
    }


def _initialize(
    model: Any, args: dict[str, str], link: ServerLink | None, version_dir: str
) -> None:
    initialize = getattr(model, "initialize", None)
    if initialize is None:
        return
    token = scope.enter(scope.ExecutionScope(link, version_dir,
                                             phase=scope.Phase.INITIALIZE))
    try:
        initialize(args)
    finally:
        scope.leave(token)
