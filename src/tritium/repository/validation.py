"""Checks a completed ModelConfig against the rules Triton and tritium enforce at load."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import PurePosixPath
from typing import Any

from tritium.core.config_pb import model_config_pb2 as pb
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.types import DataType
from tritium.ensemble.validation import (
    ENSEMBLE_PLATFORM,
    EnsembleConfigError,
    is_ensemble,
    validate_ensemble_scheduling,
)

SUPPORTED_BACKEND = "python"
WILDCARD_DIM = -1

# What one model may ask for. Each of these counts becomes threads or objects at load, so a
# config sent with a load request could otherwise take the server's memory or threads.
MAX_INSTANCES = 256  # instances of one model version, all instance groups together
MAX_PRIORITY_LEVELS = 1024  # dynamic_batching.priority_levels: one queue each
MAX_DIMS = 64  # dims of one tensor (and of its reshape)
MAX_PREFERRED_BATCH_SIZES = 1024  # entries in one preferred_batch_size list
MAX_ELEMENT_COUNT = 2**63 - 1  # the fixed dims of one tensor multiplied: must fit int64

_KIND = pb.ModelInstanceGroup
_QUEUE = pb.ModelQueuePolicy


class ConfigError(TritiumError):
    """A model repository or model configuration that cannot be used (INVALID_ARG)."""

    def __init__(self, message: str):
        super().__init__(ErrorCode.INVALID_ARG, message)


def validate_model_config(config: Any) -> None:
    """Raise ConfigError unless ``config`` (already completed) can be served by tritium."""
    validate_model_identity(config)
    validate_model_bounds(config)
    _check_batching(config)
    _check_sequence_features(config)
    _check_response_cache(config)
    validate_instance_groups(config)
    _check_tensors(config)


def validate_model_bounds(config: Any) -> None:
    """Every count that allocates stays under its limit; the error names the field."""
    total = sum(max(g.count, 1) * max(len(g.gpus), 1) for g in config.instance_group)
    if total > MAX_INSTANCES:
        raise ConfigError(
            f"'instance_group' count asks for {total} instances of model '{config.name}' in "
            f"all, more than the {MAX_INSTANCES} one model may have"
        )
    levels = config.dynamic_batching.priority_levels
    if levels > MAX_PRIORITY_LEVELS:
        raise ConfigError(
            f"'dynamic_batching.priority_levels' is {levels} for {config.name}, more than "
            f"the {MAX_PRIORITY_LEVELS} tritium allows"
        )
    for field, sizes in (("dynamic_batching", config.dynamic_batching.preferred_batch_size),
                         ("sequence_batching.oldest",
                          config.sequence_batching.oldest.preferred_batch_size)):
        if len(sizes) > MAX_PREFERRED_BATCH_SIZES:
            raise ConfigError(
                f"'{field}.preferred_batch_size' lists {len(sizes)} sizes for {config.name}, "
                f"more than the {MAX_PREFERRED_BATCH_SIZES} tritium allows"
            )
    for kind, tensors in (("input", config.input), ("output", config.output)):
        for tensor in tensors:
            _check_tensor_bounds(config, kind, tensor)
    _check_model_filename(config)


def _check_tensor_bounds(config: Any, kind: str, tensor: Any) -> None:
    where = f"model {kind} '{tensor.name}' of {config.name}"
    shapes = [("dims", tensor.dims)]
    if tensor.HasField("reshape"):
        shapes.append(("reshape.shape", tensor.reshape.shape))
    for field, dims in shapes:
        if len(dims) > MAX_DIMS:
            raise ConfigError(
                f"{where} has {len(dims)} '{field}', more than the {MAX_DIMS} tritium allows"
            )
        if math.prod(d for d in dims if d > 0) > MAX_ELEMENT_COUNT:
            raise ConfigError(f"{where}: the element count of its '{field}' overflows int64")


def _check_model_filename(config: Any) -> None:
    # The backend imports <version dir>/<default_model_filename>; a config from a client
    # (a load override) must not point it at a file elsewhere on the server.
    filename = config.default_model_filename
    if not filename:
        return
    bad = ("/" in filename or "\\" in filename or filename in (".", "..")
           or any(c < " " for c in filename))
    if bad:
        raise ConfigError(
            f"'default_model_filename' of {config.name} must be a file name in the version "
            f"directory, not the path {filename!r}"
        )


def _check_sequence_features(config: Any) -> None:
    # Served wrongly rather than refused, these would corrupt a stateful model's results.
    if not config.HasField("sequence_batching"):
        return
    batching = config.sequence_batching
    _check_control_kinds(config, batching)


def _check_control_kinds(config: Any, batching: Any) -> None:
    # One tensor per control kind, as Triton requires; this also bounds the tensors the
    # sequence batcher adds to every request.
    seen: set[int] = set()
    for control_input in batching.control_input:
        for control in control_input.control:
            if control.kind in seen:
                kind = pb.ModelSequenceBatching.Control.Kind.Name(control.kind)
                raise ConfigError(
                    f"sequence batching specifies multiple {kind} tensors for {config.name}"
                )
            seen.add(control.kind)


def validate_model_identity(config: Any) -> None:
    """The model has a name and runs on the one backend tritium has."""
    if not config.name:
        raise ConfigError("model configuration must specify 'name'")
    if config.platform == ENSEMBLE_PLATFORM:
        if config.backend:
            raise ConfigError(
                f"Ensemble model '{config.name}' must have platform type "
                f"'{ENSEMBLE_PLATFORM}' and empty backend type"
            )
        return
    if config.backend == SUPPORTED_BACKEND:
        return
    if config.backend:
        raise ConfigError(
            f"backend '{config.backend}' is not supported by tritium; only python "
            f"(model '{config.name}')"
        )
    if config.platform:
        raise ConfigError(
            f"platform '{config.platform}' is not supported by tritium; only the python "
            f"backend (model '{config.name}')"
        )
    raise ConfigError(
        f"must specify 'platform' or 'backend' for '{config.name}': no backend is set and "
        "the version directory holds no model.py"
    )


def validate_instance_groups(config: Any) -> None:
    """Every group runs on a device this machine has; tritium has no GPU support yet."""
    if is_ensemble(config):
        return  # an ensemble has no instances (its own check refuses any group)
    if not config.instance_group:
        raise ConfigError(f"must specify one or more 'instance group's for {config.name}")
    for group in config.instance_group:
        where = f"instance group {group.name} of model {config.name}"
        if group.kind == _KIND.KIND_GPU:
            raise ConfigError(f"{where}: KIND_GPU requested but no GPU is available")
        if group.gpus:
            kind = _KIND.Kind.Name(group.kind)
            # KIND_AUTO with GPUs listed resolves to KIND_CPU on a machine without them.
            kind = "KIND_CPU" if kind == "KIND_AUTO" else kind
            raise ConfigError(f"{where} has kind {kind} but specifies one or more GPUs")
        if group.profile:
            raise ConfigError(
                f"{where} specifies profile field which is only supported for TensorRT models"
            )


def _check_batching(config: Any) -> None:
    name = config.name
    if config.max_batch_size < 0:
        raise ConfigError(f"'max_batch_size' must be non-negative value for {name}")
    scheduler = config.WhichOneof("scheduling_choice")
    if scheduler == "dynamic_batching":
        _check_preferred(config, config.dynamic_batching.preferred_batch_size, "dynamic batching")
        _check_priorities(config)
    elif scheduler == "sequence_batching":
        batcher = config.sequence_batching
        if batcher.WhichOneof("strategy_choice") == "oldest":
            _check_preferred(
                config, batcher.oldest.preferred_batch_size, "sequence batching"
            )
        utilization = batcher.direct.minimum_slot_utilization
        if not 0.0 <= utilization <= 1.0:
            raise ConfigError(
                f"sequence batching minimum slot utilization must be in range (0.0, 1.0] "
                f"for {name}"
            )
    if is_ensemble(config):
        try:
            validate_ensemble_scheduling(config)
        except EnsembleConfigError as exc:
            raise ConfigError(exc.message) from None


def _check_preferred(config: Any, sizes: Iterable[int], what: str) -> None:
    for size in sizes:
        if size <= 0:
            raise ConfigError(f"{what} preferred size must be positive for {config.name}")
        if size > config.max_batch_size:
            raise ConfigError(
                f"{what} preferred size must be <= max batch size for {config.name}"
            )


def _check_priorities(config: Any) -> None:
    batching = config.dynamic_batching
    levels = batching.priority_levels
    name = config.name
    if levels != 0:
        if not 1 <= batching.default_priority_level <= levels:
            raise ConfigError(
                f"default priority level must be in range [1, {levels}] for {name}"
            )
        if any(not 1 <= level <= levels for level in batching.priority_queue_policy):
            raise ConfigError(
                f"priority queue policy must have priority level in range [1, {levels}] "
                f"for {name}"
            )
    if not batching.preserve_ordering:
        return
    if levels > 1:
        raise ConfigError(
            f"Only one priority level is allowed when 'preserve_ordering' is true for {name}"
        )
    policies = [batching.default_queue_policy, *batching.priority_queue_policy.values()]
    for policy in policies:
        if policy.default_timeout_microseconds != 0 and policy.timeout_action == _QUEUE.DELAY:
            raise ConfigError(
                "Queue policy can not have DELAY as timeout action when 'preserve_ordering' "
                f"is true for {name}"
            )


def _check_response_cache(config: Any) -> None:
    if not config.response_cache.enable:
        return
    if config.HasField("sequence_batching"):
        blocker = "sequence batching scheduler"
    elif config.model_transaction_policy.decoupled:
        blocker = "'decoupled' transaction policy"
    else:
        return
    raise ConfigError(
        f"Response Cache does not currently support model {config.name} with {blocker}. "
        "Please disable the response cache."
    )


def _check_tensors(config: Any) -> None:
    for kind, tensors in (("input", config.input), ("output", config.output)):
        seen: set[str] = set()
        for tensor in tensors:
            _check_tensor(config, kind, tensor)
            if tensor.name in seen:
                raise ConfigError(
                    f"model {kind} '{tensor.name}' is declared more than once for {config.name}"
                )
            seen.add(tensor.name)


def _check_tensor(config: Any, kind: str, tensor: Any) -> None:
    if not tensor.name:
        raise ConfigError(f"model {kind} must specify 'name' for {config.name}")
    where = f"model {kind} '{tensor.name}'"
    suffix = f" for {config.name}"
    type_name = pb.DataType.Name(tensor.data_type) if _known_type(tensor.data_type) else ""
    if DataType.from_config(type_name) is None:
        raise ConfigError(f"{where} must specify 'data_type'{suffix}")
    problem = shape_problem(tensor, config.max_batch_size)
    if problem:
        raise ConfigError(f"{where} {problem}{suffix}")
    if tensor.is_shape_tensor:
        raise ConfigError(f"shape tensors are only supported for TensorRT platform{suffix}")
    if kind == "output" and tensor.label_filename:
        _check_label_filename(config, tensor)
    if kind == "input" and tensor.format != pb.ModelInput.FORMAT_NONE and len(tensor.dims) != 3:
        raise ConfigError(f"model input NHWC/NCHW require 3 dims{suffix}")


def _check_label_filename(config: Any, tensor: Any) -> None:
    # A config can come from a client (a load request's override): keep its label file
    # inside the model directory, so classification cannot read other files out.
    path = PurePosixPath(tensor.label_filename)
    if path.is_absolute() or ".." in path.parts or "\\" in tensor.label_filename:
        raise ConfigError(
            f"model output '{tensor.name}' has label_filename '{tensor.label_filename}', "
            f"which must be a relative path inside the model directory for {config.name}"
        )


def _known_type(value: int) -> bool:
    return value in pb.DataType.values()


def shape_problem(tensor: Any, max_batch_size: int) -> str:
    """What is wrong with a tensor's ``dims`` and ``reshape``, or "" when nothing is."""
    if not tensor.dims:
        return "must specify 'dims'"
    has_reshape = tensor.HasField("reshape")
    if has_reshape and not tensor.reshape.shape and max_batch_size == 0:
        return (
            "cannot have empty reshape for non-batching model as scalar tensors are not "
            "supported"
        )
    if any(d < 1 and d != WILDCARD_DIM for d in tensor.dims):
        return "dimension must be integer >= 1, or -1 to indicate a variable-size dimension"
    if not has_reshape:
        return ""
    shape = list(tensor.reshape.shape)
    if any(d < 1 and d != WILDCARD_DIM for d in shape):
        return (
            "reshape dimensions must be integer >= 1, or -1 to indicate a variable-size "
            "dimension"
        )
    return _reshape_problem(list(tensor.dims), shape)


def _reshape_problem(dims: list[int], shape: list[int]) -> str:
    if not shape:
        # An empty reshape turns a one-element tensor into a scalar.
        ok = WILDCARD_DIM not in dims and math.prod(dims) == 1
        return "" if ok else "has different size for dims and reshape"
    dims_chunks, shape_chunks = _chunks(dims), _chunks(shape)
    if len(dims_chunks) != len(shape_chunks):
        if WILDCARD_DIM in dims and WILDCARD_DIM in shape:
            return "has different number of variable-size dimensions for dims and reshape"
        return "has different size for dims and reshape"
    if dims_chunks != shape_chunks:
        return "has different size for dims and reshape"
    return ""


def _chunks(dims: list[int]) -> list[int]:
    """Element counts of the runs between variable-size dimensions: [2,4,-1,6] → [8,6]."""
    counts = [1]
    for dim in dims:
        if dim == WILDCARD_DIM:
            counts.append(1)
        else:
            counts[-1] *= dim
    return counts
