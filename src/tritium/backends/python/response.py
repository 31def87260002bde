"""pb_utils.InferenceResponse and its conversion to and from core responses."""

from __future__ import annotations

import json
from collections.abc import Container
from typing import Any

from tritium.backends.python import arguments
from tritium.backends.python.errors import TritonError, TritonModelException
from tritium.backends.python.pb_tensor import Tensor
from tritium.core import messages
from tritium.core.response import InferenceResponse as CoreResponse

# Stands for "output_tensors not given", which Triton's binding defaults to an empty list.
_NO_OUTPUTS: Any = object()


class InferenceResponse:
    """What a model returns or sends for one request (or receives from a BLS call)."""

    __slots__ = ("_error", "_outputs", "_parameters")

    def __init__(
        self,
        output_tensors: list[Tensor] | None = _NO_OUTPUTS,
        error: TritonError | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> None:
        # Made once per response: the usual arguments (a list of exactly Tensors, no error,
        # no parameters) are recognised by exact type tests (a loop: a set built from
        # ``map(type, ...)`` costs more for the one or two outputs of most responses);
        # others get the full checks.
        outputs = None
        if type(output_tensors) is list:
            outputs = output_tensors
            for tensor in outputs:
                if type(tensor) is not Tensor:
                    outputs = None
                    break
        self._outputs = (_checked_outputs(output_tensors) if outputs is None
                         else outputs.copy())
        self._error = None if error is None else arguments.optional_instance(
            "InferenceResponse.__init__()", "error", error, TritonError)
        self._parameters = {} if parameters is None else check_parameters(parameters)

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return json.dumps(self._parameters)

    def __repr__(self) -> str:
        if self._error is not None:
            return f"InferenceResponse(error={self._error!r})"
        return f"InferenceResponse({self._outputs!r})"


def _checked_outputs(output_tensors: Any) -> list[Tensor]:
    # Triton's default is an empty list; None converts to no std::vector (TypeError).
    outputs = [] if output_tensors is _NO_OUTPUTS else output_tensors
    checked = arguments.instances("InferenceResponse.__init__()", "output_tensors", outputs,
                                  Tensor)
    if None in checked:
        raise TritonModelException(messages.PB_EMPTY_RESPONSE_OUTPUT)
    return checked  # type: ignore[return-value]


def check_parameters(parameters: Any) -> dict[str, Any]:
    """A copy of ``parameters`` after Triton's checks: str keys, bool/int/str values."""
    if parameters is None:
        return {}
    # Types named as Python prints them ("<class 'float'>"), as Triton's stub does.
    if not isinstance(parameters, dict):
        raise TritonModelException(messages.PB_NOT_DICT.format(type=type(parameters)))
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(messages.PB_PARAMETER_KEY.format(type=type(key)))
        if not isinstance(value, (bool, int, str)):
            raise TritonModelException(messages.PB_PARAMETER_VALUE.format(type=type(value)))
    return dict(parameters)


def to_core(response: InferenceResponse, wanted: Container[str], final: bool) -> CoreResponse:
    """The core response for ``response``, keeping only the outputs in ``wanted``.

    Triton prunes outputs that were not requested without a word; since requests are
    validated against the config, that also drops outputs the config does not declare.
    """
    if response._error is not None:
        return CoreResponse(error=response._error.to_core(), final=final)
    outputs = []
    for tensor in response._outputs:  # a loop: before Python 3.12 a comprehension is a call
        core = tensor._core
        if core.name in wanted:
            outputs.append(core)
    # Positional (outputs, parameters, error, final): keywords would cost a dict a call.
    return CoreResponse(outputs, response._parameters, None, final)


def from_core(core: CoreResponse) -> InferenceResponse:
    """A BLS caller's view of a core response (outputs wrap the same arrays)."""
    response = InferenceResponse.__new__(InferenceResponse)
    response._outputs = [Tensor._wrap(tensor) for tensor in core.outputs]
    response._error = None if core.error is None else TritonError.from_core(core.error)
    response._parameters = dict(core.parameters)
    return response
