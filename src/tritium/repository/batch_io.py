"""``batch_input`` and ``batch_output``, checked as Triton checks them (ValidateBatchIO).

Nothing more comes of them for a python model, as with Triton: its python backend makes
no batch input tensors (the backends that concatenate ragged inputs do) and scatters no
batch outputs. What ``allow_ragged_batch`` changes for a python model is which requests
the batchers put together (``SchedulerPolicy.equal_shape_inputs``).
"""

from __future__ import annotations

from typing import Any

from tritium.core.config_pb import model_config_pb2
from tritium.repository.validation import ConfigError

_INPUT_KINDS = frozenset(model_config_pb2.BatchInput.Kind.values())
_OUTPUT_KINDS = frozenset(model_config_pb2.BatchOutput.Kind.values())
_TYPES = (model_config_pb2.TYPE_INT32, model_config_pb2.TYPE_FP32)


def validate_batch_io(config: Any) -> None:
    """Raise ConfigError with Triton's words (and the model's name) for a bad entry."""
    problem = _batch_io_problem(config)
    if problem:
        raise ConfigError(f"{problem} for {config.name}")


def _batch_io_problem(config: Any) -> str:
    inputs = {tensor.name for tensor in config.input}
    outputs = {tensor.name for tensor in config.output}
    for entry in config.batch_input:
        kind = _kind_name(model_config_pb2.BatchInput.Kind, entry.kind)
        if entry.kind not in _INPUT_KINDS:
            return f"unknown batch input kind '{kind}'"
        if len(entry.source_input) != 1:
            return (f"batch input kind '{kind}' expects 1 source input, got "
                    f"{len(entry.source_input)}")
        if entry.data_type not in _TYPES:
            return "batch input data type must be TYPE_INT32 or TYPE_FP32"
        problem = _unknown_sources(entry, inputs)
        if problem:
            return problem
    for entry in config.batch_output:
        kind = _kind_name(model_config_pb2.BatchOutput.Kind, entry.kind)
        if entry.kind not in _OUTPUT_KINDS:
            return f"unknown batch output kind '{kind}'"
        if len(entry.source_input) != 1:
            return (f"batch output kind '{kind}' expects 1 source input, got "
                    f"{len(entry.source_input)}")
        problem = _unknown_sources(entry, inputs) or _bad_targets(entry, outputs)
        if problem:
            return problem
    return ""


def _unknown_sources(entry: Any, inputs: set[str]) -> str:
    unknown = [name for name in entry.source_input if name not in inputs]
    return f"unknown source input name '{unknown[0]}'" if unknown else ""


def _bad_targets(entry: Any, outputs: set[str]) -> str:
    seen: set[str] = set()
    for name in entry.target_name:
        if name not in outputs:
            return f"unknown target output name '{name}'"
        if name in seen:
            return f"target output name '{name}' can only be specified once"
        seen.add(name)
    return ""


def _kind_name(enum: Any, value: int) -> str:
    try:
        return str(enum.Name(value))
    except ValueError:
        return ""  # protobuf's Kind_Name of a value it does not know
