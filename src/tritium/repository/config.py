"""A model's config.pbtxt read into Triton's ModelConfig and completed as Triton does."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format

from tritium.core.config_pb import model_config_pb2 as pb
from tritium.core.types import DataType, TensorSpec
from tritium.ensemble.validation import is_ensemble
from tritium.repository.batch_io import validate_batch_io
from tritium.repository.scan import find_models
from tritium.repository.validation import (
    ConfigError,
    validate_instance_groups,
    validate_model_bounds,
    validate_model_config,
    validate_model_identity,
)
from tritium.repository.versions import available_versions, version_dirs

# The repository's whole API is importable from here; scan/versions/validation hold parts.
__all__ = [
    "AutoComplete",
    "ConfigError",
    "ModelConfig",
    "PreparedConfig",
    "available_versions",
    "complete_model_config",
    "config_path",
    "config_to_json",
    "find_models",
    "finish_model_config",
    "json_to_config",
    "load_model_config",
    "parse_model_config",
    "prepare_model_config",
    "read_model_config",
    "tensor_specs",
    "validate_model_config",
]

ModelConfig = pb.ModelConfig
# Given the model's directory and the config so far, returns the completed config; the
# python backend supplies it (it runs the model's static auto_complete_config).
AutoComplete = Callable[[Path, Any], Any]

CONFIG_FILE = "config.pbtxt"
CONFIG_FOLDER = "configs"
PYTHON_FILE = "model.py"
SEQUENCE_IDLE_DEFAULT_US = 1_000_000

_KIND = pb.ModelInstanceGroup


def config_path(model_dir: Path, config_name: str | None = None) -> Path:
    """``configs/<name>.pbtxt`` when chosen and present, else ``config.pbtxt`` (as Triton)."""
    if config_name:
        custom = model_dir / CONFIG_FOLDER / f"{config_name}.pbtxt"
        if custom.is_file():
            return custom
    return model_dir / CONFIG_FILE


@dataclass(frozen=True, slots=True)
class PreparedConfig:
    """A config checked as far as it can be without running model code (what Triton
    checks when it polls a model), and where it came from, for error messages."""

    config: Any
    source: str = ""  # "" for a config that came with a load request


def load_model_config(
    model_dir: Path, auto_complete: AutoComplete | None, config_name: str | None = None
) -> Any:
    """Read, complete and validate the configuration of the model in ``model_dir``.

    The file may be missing or partial when ``auto_complete`` is given; without it (the
    server runs with auto-complete disabled) a missing file is an error, as in Triton.
    """
    prepared = read_model_config(model_dir, auto_complete is not None, config_name)
    return finish_model_config(model_dir, prepared, auto_complete)


def read_model_config(model_dir: Path, auto_completing: bool, config_name: str | None = None
                      ) -> PreparedConfig:
    """Read and prepare the configuration file of the model in ``model_dir``."""
    path = config_path(model_dir, config_name)
    if path.is_file():
        config = parse_model_config(_read(path, model_dir.name), path, model_dir.name)
        source = str(path)
    elif not auto_completing:
        raise ConfigError(
            f"model '{model_dir.name}' has no configuration file {path} and auto-complete "
            "is disabled"
        )
    else:
        config = pb.ModelConfig()
        source = f"{model_dir}, which has no {path.name}"
    try:
        return PreparedConfig(prepare_model_config(model_dir, config), source)
    except ConfigError as exc:
        raise ConfigError(f"{exc.message} (in {source})") from exc


def parse_model_config(text: str, path: Path, model_name: str) -> Any:
    """Parse protobuf text format; the error names the file, line and offending text."""
    try:
        return text_format.Parse(text, pb.ModelConfig())
    except text_format.ParseError as exc:
        raise ConfigError(_parse_message(exc, text, path, model_name)) from exc


def complete_model_config(model_dir: Path, config: Any, auto_complete: AutoComplete | None) -> Any:
    """Fill what Triton fills, run auto-complete for python models, then validate.

    Returns a new message; ``config`` is left as it was.
    """
    prepared = PreparedConfig(prepare_model_config(model_dir, config))
    return finish_model_config(model_dir, prepared, auto_complete)


def prepare_model_config(model_dir: Path, config: Any) -> Any:
    """Fill what Triton fills and check everything that needs no model code; returns a
    new message. Also the first step of a load with a ``config`` override."""
    config = _copy(config)
    _check_name(config, model_dir.name)
    _fill_backend(config, model_dir)
    _normalize(config)
    _normalize_instance_groups(config)
    # Fail before running any model code when the model can never load here, or would
    # take more than a server can give.
    validate_model_identity(config)
    validate_instance_groups(config)
    validate_model_bounds(config)
    return config


def finish_model_config(model_dir: Path, prepared: PreparedConfig,
                        auto_complete: AutoComplete | None) -> Any:
    """Run auto-complete (model code) on a prepared config, then validate the result."""
    config = prepared.config
    try:
        # An ensemble has no model code: no backend completes its config.
        if auto_complete is not None and not is_ensemble(config):
            config = _auto_complete(model_dir, config, auto_complete)
            _normalize(config)
        validate_model_config(config)
        validate_batch_io(config)
    except ConfigError as exc:
        if not prepared.source:
            raise
        raise ConfigError(f"{exc.message} (in {prepared.source})") from exc
    return config


def tensor_specs(config: Any) -> tuple[dict[str, TensorSpec], dict[str, TensorSpec]]:
    """Inputs and outputs of a validated config, in config order."""
    inputs = {t.name: _spec(t, optional=t.optional) for t in config.input}
    outputs = {t.name: _spec(t, optional=False) for t in config.output}
    return inputs, outputs


def _spec(tensor: Any, optional: bool) -> TensorSpec:
    datatype = DataType.from_config(pb.DataType.Name(tensor.data_type))
    if datatype is None:
        raise ConfigError(f"tensor '{tensor.name}' has no valid data_type")
    reshape = tuple(tensor.reshape.shape) if tensor.HasField("reshape") else None
    return TensorSpec(tensor.name, datatype, tuple(tensor.dims), optional, reshape)


def _read(path: Path, model_name: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"unable to read {path} for model '{model_name}': {exc}") from exc


def _parse_message(exc: text_format.ParseError, text: str, path: Path, model: str) -> str:
    line, column = exc.GetLine(), exc.GetColumn()
    detail = str(exc)
    prefix = f"{line}:{column} : "
    detail = detail.removeprefix(prefix)
    message = f"unable to parse {path} for model '{model}': line {line}, column {column}: {detail}"
    lines = text.splitlines()
    if line is not None and 0 < line <= len(lines):
        source = lines[line - 1].strip()
        if source and source not in detail:
            message += f" (line {line}: '{source}')"
    return message


def _copy(config: Any) -> Any:
    result = pb.ModelConfig()
    result.CopyFrom(config)
    return result


def _check_name(config: Any, dir_name: str) -> None:
    if not config.name:
        config.name = dir_name
    elif config.name != dir_name:
        raise ConfigError(
            f"unexpected directory name '{dir_name}' for model '{config.name}', directory "
            "name must equal model name"
        )


def _fill_backend(config: Any, model_dir: Path) -> None:
    if not config.backend and _looks_like_python(config, model_dir):
        config.backend = "python"
    if config.backend == "python" and not config.default_model_filename:
        config.default_model_filename = PYTHON_FILE


def _looks_like_python(config: Any, model_dir: Path) -> bool:
    if config.default_model_filename == PYTHON_FILE:
        return True
    if config.platform or config.default_model_filename:
        return False
    return _first_version_has(model_dir, PYTHON_FILE)


def _first_version_has(model_dir: Path, filename: str) -> bool:
    # Triton inspects only the first version directory, in name order ("1" < "10" < "2").
    dirs = version_dirs(model_dir)
    if not dirs:
        return False
    first = min(dirs.values(), key=lambda p: p.name)
    return (first / filename).is_file()


def _normalize(config: Any) -> None:
    """Defaults Triton writes into every config, before and again after auto-complete."""
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    batched = config.max_batch_size > 0
    if config.HasField("dynamic_batching"):
        preferred = config.dynamic_batching.preferred_batch_size
        if not preferred and batched:
            preferred.append(config.max_batch_size)
    if config.HasField("sequence_batching"):
        batcher = config.sequence_batching
        if batcher.max_sequence_idle_microseconds == 0:
            batcher.max_sequence_idle_microseconds = SEQUENCE_IDLE_DEFAULT_US
        if batcher.HasField("oldest") and not batcher.oldest.preferred_batch_size and batched:
            batcher.oldest.preferred_batch_size.append(config.max_batch_size)
    if not config.HasField("ensemble_scheduling"):
        optimization = config.optimization
        if not optimization.HasField("input_pinned_memory"):
            optimization.input_pinned_memory.enable = True
        if not optimization.HasField("output_pinned_memory"):
            optimization.output_pinned_memory.enable = True


def _normalize_instance_groups(config: Any) -> None:
    """Triton's defaults for a machine without GPUs: KIND_AUTO becomes KIND_CPU."""
    if config.HasField("ensemble_scheduling"):
        return
    if not config.instance_group:
        # Triton names the group it adds after the model itself, not "<model>_0".
        config.instance_group.add(name=config.name, kind=_KIND.KIND_CPU, count=1)
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"
        if group.kind == _KIND.KIND_AUTO:
            group.kind = _KIND.KIND_CPU
        if group.count < 1:
            group.count = 1


def _auto_complete(model_dir: Path, config: Any, auto_complete: AutoComplete) -> Any:
    try:
        completed = auto_complete(model_dir, _copy(config))
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(
            f"auto-complete of model '{config.name}' failed: {exc}"
        ) from exc
    if not isinstance(completed, pb.ModelConfig):
        raise ConfigError(
            f"auto-complete of model '{config.name}' returned {type(completed).__name__}, "
            "not a ModelConfig"
        )
    return _merge_completed(config, completed)


def _merge_completed(config: Any, completed: Any) -> Any:
    """Take from auto-complete only the fields Triton lets a backend change."""
    merged = _copy(config)
    merged.max_batch_size = completed.max_batch_size
    del merged.input[:]
    merged.input.extend(completed.input)
    del merged.output[:]
    merged.output.extend(completed.output)
    old, new = config.WhichOneof("scheduling_choice"), completed.WhichOneof("scheduling_choice")
    if old is None and new is not None:
        getattr(merged, new).CopyFrom(getattr(completed, new))
    elif old is not None and new is not None and old != new:
        raise ConfigError(
            f"auto-complete of model '{config.name}' cannot change the scheduler from "
            f"{old} to {new}"
        )
    if completed.HasField("model_transaction_policy"):
        decoupled = completed.model_transaction_policy.decoupled
        merged.model_transaction_policy.decoupled = decoupled
    return merged


# -- JSON form (HTTP /config, gRPC-less consumers, python args["model_config"]) ---------

# Protobuf prints 64-bit integers as strings; Triton turns these back into numbers.
# Path steps: a field name, "[]" for each list item, "{}" for each map value.
_INT64_PATHS: tuple[tuple[str, ...], ...] = (
    ("input", "[]", "dims"),
    ("input", "[]", "reshape", "shape"),
    ("output", "[]", "dims"),
    ("output", "[]", "reshape", "shape"),
    ("version_policy", "specific", "versions"),
    ("dynamic_batching", "max_queue_delay_microseconds"),
    ("dynamic_batching", "priority_levels"),
    ("dynamic_batching", "default_priority_level"),
    ("dynamic_batching", "default_queue_policy", "default_timeout_microseconds"),
    ("dynamic_batching", "priority_queue_policy", "{}", "default_timeout_microseconds"),
    ("sequence_batching", "max_sequence_idle_microseconds"),
    ("sequence_batching", "direct", "max_queue_delay_microseconds"),
    ("sequence_batching", "oldest", "max_queue_delay_microseconds"),
    ("sequence_batching", "state", "[]", "dims"),
    ("sequence_batching", "state", "[]", "initial_state", "[]", "dims"),
    ("ensemble_scheduling", "step", "[]", "model_version"),
    ("model_warmup", "[]", "inputs", "{}", "dims"),
)


def config_to_json(config: Any) -> dict[str, Any]:
    """Triton's JSON form: proto field names, every field printed, int64s as numbers."""
    printed = json_format.MessageToDict(
        config, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    ordered = _in_field_order(config.DESCRIPTOR, printed)
    for path in _INT64_PATHS:
        _fix_int64(ordered, path)
    return ordered


def json_to_config(text: str) -> Any:
    """Parse the JSON form (a load request's ``config`` override) into a ModelConfig."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"Invalid config override: {exc}") from exc
    # Python's protobuf would quietly accept a list; Triton's parser wants an object.
    if not isinstance(value, dict):
        raise ConfigError("Invalid config override: expected a JSON object")
    try:
        return json_format.ParseDict(value, pb.ModelConfig())
    except json_format.ParseError as exc:
        raise ConfigError(f"Invalid config override: {exc}") from exc


def _in_field_order(descriptor: Any, printed: dict[str, Any]) -> dict[str, Any]:
    # Python's printer puts set fields first; Triton's follows the .proto field order.
    ordered: dict[str, Any] = {}
    for field in descriptor.fields:
        if field.name not in printed:
            continue
        value = printed[field.name]
        sub = field.message_type
        if sub is not None and not sub.GetOptions().map_entry:
            if isinstance(value, list):
                value = [_in_field_order(sub, item) for item in value]
            else:
                value = _in_field_order(sub, value)
        ordered[field.name] = value
    return ordered


def _fix_int64(node: Any, path: tuple[str, ...]) -> None:
    step, rest = path[0], path[1:]
    if step in ("[]", "{}"):
        items = node if step == "[]" else node.values()
        for item in items:
            _fix_int64(item, rest)
        return
    if not isinstance(node, dict) or step not in node:
        return
    if rest:
        _fix_int64(node[step], rest)
    elif isinstance(node[step], list):
        node[step] = [int(v) for v in node[step]]
    else:
        node[step] = int(node[step])
