"""The public surface of ``triton_python_backend_utils`` as tritium implements it."""

from __future__ import annotations

import enum
import logging
from typing import Any

from tritium.backends.python import arguments, scope
from tritium.backends.python.errors import TritonError, TritonErrorCode, TritonModelException
from tritium.backends.python.metric import Metric, MetricFamily, MetricKind
from tritium.backends.python.model_config import ModelConfig
from tritium.backends.python.model_control import is_model_ready, load_model, unload_model
from tritium.backends.python.pb_tensor import (
    TRITON_STRING_TO_NUMPY,
    Tensor,
    deserialize_bytes_tensor,
    numpy_to_triton_type,
    serialize_byte_tensor,
    triton_string_to_numpy,
    triton_to_numpy_type,
)
from tritium.backends.python.request import (
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    InferenceRequest,
    InferenceTrace,
    MemoryType,
    PreferredMemory,
    ReceivedRequest,
)
from tritium.backends.python.response import InferenceResponse
from tritium.backends.python.sender import (
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    InferenceResponseSender,
)

__all__ = [
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITON_STRING_TO_NUMPY",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "InferenceTrace",
    "Logger",
    "MemoryType",
    "Metric",
    "MetricFamily",
    "MetricKind",
    "ModelConfig",
    "PreferredMemory",
    "Tensor",
    "TritonError",
    "TritonErrorCode",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_model_dir",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "is_model_ready",
    "load_model",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "unload_model",
    "using_decoupled_model_transaction_policy",
]

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_MEMORY_GPU = MemoryType.TRITONSERVER_MEMORY_GPU
TRITONSERVER_MEMORY_CPU = MemoryType.TRITONSERVER_MEMORY_CPU

_model_log = logging.getLogger("tritium.model")


def get_input_tensor_by_name(inference_request: Any, name: str) -> Tensor | None:
    if type(inference_request) is ReceivedRequest:
        return inference_request.input_tensor(name)  # the hot path: one dict lookup
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: Any, name: str) -> Tensor | None:
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return _config_entry(model_config, "input", name)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return _config_entry(model_config, "output", name)


def _config_entry(model_config: dict[str, Any], kind: str, name: str) -> dict[str, Any] | None:
    for entry in model_config.get(kind, ()):
        if entry["name"] == name:
            return entry
    return None


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    policy = model_config.get("model_transaction_policy")
    return bool(policy["decoupled"]) if policy is not None else False


def get_model_dir() -> str:
    """The directory that holds the calling model's model.py."""
    current = scope.current()
    if current is None:
        raise TritonModelException("get_model_dir() is only available inside model code")
    return current.model_dir


class Logger:
    """Triton's model logger, on Python logging (logger name ``tritium.model``)."""

    class LogLevel(enum.IntEnum):
        INFO = 0
        WARNING = 1
        ERROR = 2
        VERBOSE = 3

    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: int = LogLevel.INFO) -> None:
        # A pybind11 enum: a plain int is no LogLevel to it (TypeError).
        if not isinstance(level, Logger.LogLevel):
            raise arguments.incompatible("log()", "level", "a pb_utils.Logger.LogLevel", level)
        text = arguments.text("log()", "message", message)
        _model_log.log(_PYTHON_LEVEL[level], "%s", text, stacklevel=2)

    @staticmethod
    def log_info(message: str) -> None:
        _model_log.info("%s", arguments.text("log_info()", "message", message), stacklevel=2)

    @staticmethod
    def log_warn(message: str) -> None:
        _model_log.warning("%s", arguments.text("log_warn()", "message", message), stacklevel=2)

    @staticmethod
    def log_error(message: str) -> None:
        _model_log.error("%s", arguments.text("log_error()", "message", message), stacklevel=2)

    @staticmethod
    def log_verbose(message: str) -> None:
        _model_log.debug("%s", arguments.text("log_verbose()", "message", message), stacklevel=2)


_PYTHON_LEVEL = {
    Logger.LogLevel.INFO: logging.INFO,
    Logger.LogLevel.WARNING: logging.WARNING,
    Logger.LogLevel.ERROR: logging.ERROR,
    Logger.LogLevel.VERBOSE: logging.DEBUG,
}
