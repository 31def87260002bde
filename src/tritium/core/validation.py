"""Checks a request against its model's configuration before it is queued."""

from __future__ import annotations

from tritium.core import messages
from tritium.core.errors import ErrorCode, TritiumError, invalid
from tritium.core.model import ModelHandle
from tritium.core.request import InferenceRequest
from tritium.core.types import DataType, Tensor, TensorSpec

MAX_DIMS = 64  # Triton's bound on a tensor's rank
# numpy refuses arrays whose elements (8 bytes for BYTES' object pointers) pass its index range.
_MAX_EXTENT = ((1 << 63) - 1) // 8


def validate_request(request: InferenceRequest, model: ModelHandle) -> int:
    """Raise INVALID_ARG unless every input and requested output fits the model.

    On success returns the request's batch size (1 when the model does not batch);
    reshaped inputs then carry the shape the model's configuration asks it to see.
    """
    prefix = f"[request id: {request.describe()}] "
    batched = model.max_batch_size > 0
    for name, tensor in request.inputs.items():
        spec = model.inputs.get(name)
        if spec is None:
            raise invalid(f"{prefix}unexpected inference input '{name}' for model '{model.name}'")
        _check_tensor(prefix, model.name, spec, tensor, batched)
    missing = [spec.name for spec in model.inputs.values()
               if spec.name not in request.inputs and not spec.optional]
    if missing:
        raise invalid(prefix + _missing_inputs(model, list(request.inputs), missing))
    batch_size = _batch_size(prefix, request, model) if batched else 1
    if request.requested_outputs is not None:
        for output in request.requested_outputs:
            if output.name not in model.outputs:
                raise invalid(
                    f"{prefix}unexpected inference output '{output.name}' for model "
                    f"'{model.name}'"
                )
    _apply_reshapes(request, model, batched)
    return batch_size


def element_count(name: str, shape: tuple[int, ...], prefix: str = "") -> int:
    """The elements ``shape`` holds; INVALID_ARG for a shape no tensor can have (too many
    dimensions, or more elements than an array can index), before any data is read."""
    if len(shape) > MAX_DIMS:
        raise invalid(
            f"{prefix}input '{name}' has {len(shape)} dimensions, more than the {MAX_DIMS} "
            "allowed"
        )
    count = extent = 1
    for dim in shape:
        count *= dim
        extent *= max(dim, 1)
    if extent > _MAX_EXTENT:
        raise invalid(
            f"{prefix}input '{name}' has shape {list(shape)}, which holds more elements than "
            "a tensor can"
        )
    return count


def check_input(model: ModelHandle, name: str, datatype: DataType, shape: tuple[int, ...],
                prefix: str) -> None:
    """What ``validate_request`` checks of one input that needs none of its data: run by
    the codecs before they decode any, so a request that cannot be served costs nothing."""
    spec = model.inputs.get(name)
    if spec is None:
        raise invalid(f"{prefix}unexpected inference input '{name}' for model '{model.name}'")
    batched = model.max_batch_size > 0
    _check_fit(prefix, model.name, spec, name, datatype, shape, batched)
    if batched and shape[0] > model.max_batch_size:
        raise invalid(
            f"{prefix}inference request batch-size must be <= {model.max_batch_size} "
            f"for '{model.name}'"
        )


def _batch_size(prefix: str, request: InferenceRequest, model: ModelHandle) -> int:
    sizes = {tensor.shape[0] for tensor in request.inputs.values()}
    if len(sizes) > 1:
        raise invalid(f"{prefix}inputs for model '{model.name}' must all have the same batch size")
    size = sizes.pop() if sizes else 1
    if size > model.max_batch_size:
        raise invalid(
            f"{prefix}inference request batch-size must be <= {model.max_batch_size} "
            f"for '{model.name}'"
        )
    return size


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


def _check_tensor(prefix: str, model: str, spec: TensorSpec, tensor: Tensor, batched: bool) -> None:
    _check_fit(prefix, model, spec, tensor.name, tensor.datatype, tensor.shape, batched)


def _check_fit(prefix: str, model: str, spec: TensorSpec, name: str, datatype: DataType,
               shape: tuple[int, ...], batched: bool) -> None:
    if datatype is not spec.datatype:
        raise invalid(
            f"{prefix}inference input '{name}' data-type is '{datatype.wire}', "
            f"but model '{model}' expects '{spec.datatype.wire}'"
        )
    dims = shape[1:] if batched else shape
    if batched and not shape:
        raise invalid(f"{prefix}input '{name}' for model '{model}' has no batch dimension")
    if len(dims) != len(spec.dims) or any(
        want != -1 and want != got for want, got in zip(spec.dims, dims, strict=True)
    ):
        raise invalid(
            f"{prefix}unexpected shape for input '{name}' for model '{model}'. "
            f"Expected {_shape_text(spec.dims, batched)}, got {list(shape)}"
        )


def _shape_text(dims: tuple[int, ...], batched: bool) -> str:
    return str(([-1] if batched else []) + list(dims))


def _apply_reshapes(request: InferenceRequest, model: ModelHandle, batched: bool) -> None:
    for name, tensor in request.inputs.items():
        reshape = model.inputs[name].reshape
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
