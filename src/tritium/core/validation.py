"""Checks a request against its model's configuration before it is queued."""

from __future__ import annotations

import math

from tritium.core import messages
from tritium.core.errors import ErrorCode, TritiumError, invalid
from tritium.core.model import ModelHandle
from tritium.core.request import InferenceRequest
from tritium.core.types import DataType, TensorSpec

MAX_DIMS = 64  # Triton's bound on a tensor's rank
# numpy refuses arrays whose elements (8 bytes for BYTES' object pointers) pass its index range.
_MAX_EXTENT = ((1 << 63) - 1) // 8


def validate_request(request: InferenceRequest, model: ModelHandle) -> int:
    """Raise INVALID_ARG unless every input and requested output fits the model.

    On success returns the request's batch size (1 when the model does not batch);
    reshaped inputs then carry the shape the model's configuration asks it to see.

    Inputs a frontend already ran ``check_input`` on for this very handle
    (``request.checked_for is model``) are not checked a second time; a request checked
    against another handle (a reload swapped versions meanwhile) is checked in full. The
    mark is used up here: the same request submitted again is checked in full.
    """
    inputs = request.inputs
    specs = model.inputs
    max_batch_size = model.max_batch_size
    batched = max_batch_size > 0
    checked, request.checked_for = request.checked_for, None  # trusted once, for one admission
    unchecked = checked is not model
    # Every input given is one of the model's (checked by the frontend, or in
    # ``_check_given``), so one can be missing only when fewer are given than declared.
    if unchecked or len(inputs) < len(specs):
        _check_given(request, model, batched, unchecked)
    # One pass for the batch size and for whether any input is reshaped: it runs for every
    # request, where a function for each cost more than the checks themselves.
    batch_size: int | None = None
    reshaped = False
    for name, tensor in inputs.items():
        if specs[name].reshape is not None:
            reshaped = True
        if batched and tensor.shape[0] != batch_size:
            if batch_size is not None:
                raise invalid(f"{_prefix(request.id)}inputs for model '{model.name}' must all "
                              "have the same batch size")
            batch_size = tensor.shape[0]
    if batch_size is None:
        batch_size = 1
    elif batch_size > max_batch_size:
        raise invalid(
            f"{_prefix(request.id)}inference request batch-size must be <= "
            f"{max_batch_size} for '{model.name}'"
        )
    if request.requested_outputs is not None:
        outputs = model.outputs
        for output in request.requested_outputs:
            if output.name not in outputs:
                raise invalid(
                    f"{_prefix(request.id)}unexpected inference output '{output.name}' for "
                    f"model '{model.name}'"
                )
    if reshaped:
        _apply_reshapes(request, model, batched)
    return batch_size


def _check_given(request: InferenceRequest, model: ModelHandle, batched: bool,
                 unchecked: bool) -> None:
    """Each input (when ``unchecked``) is declared by the model and fits it, and none the
    model requires is missing."""
    inputs = request.inputs
    if unchecked:
        _check_inputs(request, model, batched)
    missing = [spec.name for spec in model.inputs.values()
               if spec.name not in inputs and not spec.optional]
    if missing:
        raise invalid(_prefix(request.id) + _missing_inputs(model, list(inputs), missing))


def _check_inputs(request: InferenceRequest, model: ModelHandle, batched: bool) -> None:
    """Each input is declared by the model and fits its datatype and shape."""
    specs = model.inputs
    for name, tensor in request.inputs.items():
        spec = specs.get(name)
        if spec is None:
            raise invalid(f"{_prefix(request.id)}unexpected inference input '{name}' for "
                          f"model '{model.name}'")
        misfit = _misfit(model.name, spec, name, tensor.datatype, tensor.shape, batched)
        if misfit is not None:
            raise invalid(_prefix(request.id) + misfit)


def element_count(name: str, shape: tuple[int, ...], request_id: str | None = None) -> int:
    """The elements ``shape`` holds; INVALID_ARG for a shape no tensor can have (too many
    dimensions, or more elements than an array can index), before any data is read.
    ``request_id`` (when given) names the request in the message."""
    if len(shape) > MAX_DIMS:
        raise invalid(
            f"{_prefix(request_id)}input '{name}' has {len(shape)} dimensions, more than the "
            f"{MAX_DIMS} allowed"
        )
    count = math.prod(shape)
    # With a zero dimension the count says nothing of the others: (0, 2**61, 2**61) is
    # still a shape numpy cannot make.
    if count > _MAX_EXTENT or (not count and _extent(shape) > _MAX_EXTENT):
        raise invalid(
            f"{_prefix(request_id)}input '{name}' has shape {list(shape)}, which holds more "
            "elements than a tensor can"
        )
    return count


def _extent(shape: tuple[int, ...]) -> int:
    extent = 1
    for dim in shape:
        extent *= max(dim, 1)
    return extent


def check_input(model: ModelHandle, name: str, datatype: DataType, shape: tuple[int, ...],
                request_id: str | None = None) -> None:
    """What ``validate_request`` checks of one input that needs none of its data: run by
    the codecs before they decode any, so a request that cannot be served costs nothing.
    A request whose every input passed may say so (``InferenceRequest.checked_for``)."""
    spec = model.inputs.get(name)
    if spec is None:
        raise invalid(f"{_prefix(request_id)}unexpected inference input '{name}' for model "
                      f"'{model.name}'")
    max_batch_size = model.max_batch_size
    batched = max_batch_size > 0
    # Every input of every request comes here, so the usual fit is tested inline: no fixed
    # dimension, or all of them as configured (a batched shape has one more in front).
    # ``_refuse_input`` sorts out the rest.
    if (datatype is not spec.datatype or len(shape) != spec.rank + batched
            or (spec.fixed and (shape[1:] if batched else shape) != spec.dims)
            or (batched and shape[0] > max_batch_size)):
        _refuse_input(model, spec, name, datatype, shape, request_id)


def _refuse_input(model: ModelHandle, spec: TensorSpec, name: str, datatype: DataType,
                  shape: tuple[int, ...], request_id: str | None) -> None:
    """Raise INVALID_ARG for an input that does not fit ``spec`` (``check_input``'s rule);
    return if it fits after all."""
    max_batch_size = model.max_batch_size
    misfit = _misfit(model.name, spec, name, datatype, shape, max_batch_size > 0)
    if misfit is not None:
        raise invalid(_prefix(request_id) + misfit)
    if max_batch_size > 0 and shape[0] > max_batch_size:
        raise invalid(
            f"{_prefix(request_id)}inference request batch-size must be <= {max_batch_size} "
            f"for '{model.name}'"
        )


def _prefix(request_id: str | None) -> str:
    """How a message names its request; nothing when there is no request to name."""
    if request_id is None:
        return ""
    return f"[request id: {request_id or '<id_unknown>'}] "


def _missing_inputs(model: ModelHandle, given: list[str], missing: list[str]) -> str:
    """Triton core's text (InferenceRequest::ValidateRequestInputs): the exact count when
    no input is optional, else the range."""
    def quoted(names: list[str]) -> str:
        return "[" + ",".join(f"'{name}'" for name in names) + "]"

    total = len(model.inputs)
    required = sum(1 for spec in model.inputs.values() if not spec.optional)
    expected = (messages.EXPECTED_INPUTS.format(count=total) if required == total else
                messages.EXPECTED_INPUTS_BETWEEN.format(low=required, high=total))
    return messages.MISSING_INPUTS.format(expected=expected, count=len(given), model=model.name,
                                          given=quoted(given), missing=quoted(missing))


def _misfit(model: str, spec: TensorSpec, name: str, datatype: DataType,
            shape: tuple[int, ...], batched: bool) -> str | None:
    """Why an input of ``datatype`` and ``shape`` does not fit ``spec``; None if it does."""
    if datatype is not spec.datatype:
        return (f"inference input '{name}' data-type is '{datatype.wire}', "
                f"but model '{model}' expects '{spec.datatype.wire}'")
    if batched:
        if not shape:
            return f"input '{name}' for model '{model}' has no batch dimension"
        dims = shape[1:]
    else:
        dims = shape
    want = spec.dims
    if len(dims) == len(want):
        for i in spec.fixed:
            if dims[i] != want[i]:
                break
        else:
            return None
    return (f"unexpected shape for input '{name}' for model '{model}'. "
            f"Expected {_shape_text(want, batched)}, got {list(shape)}")


def _shape_text(dims: tuple[int, ...], batched: bool) -> str:
    return str(([-1] if batched else []) + list(dims))


def _apply_reshapes(request: InferenceRequest, model: ModelHandle, batched: bool) -> None:
    specs = model.inputs
    for name, tensor in request.inputs.items():
        reshape = specs[name].reshape
        if reshape is None:
            continue
        shape = ((tensor.shape[0],) if batched else ()) + reshape
        try:
            tensor.data = tensor.data.reshape(shape)
        except ValueError as exc:
            raise TritiumError(
                ErrorCode.INVALID_ARG, f"cannot reshape input '{name}': {exc}"
            ) from exc
        tensor.shape = tuple(tensor.data.shape)
