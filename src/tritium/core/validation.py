"""Checks a request against its model's configuration before it is queued."""

from __future__ import annotations

from tritium.core.errors import ErrorCode, TritiumError, invalid
from tritium.core.model import ModelHandle
from tritium.core.request import InferenceRequest
from tritium.core.types import Tensor, TensorSpec


def validate_request(request: InferenceRequest, model: ModelHandle) -> None:
    """Raise INVALID_ARG unless every input and requested output fits the model.

    On success ``request.batch_size`` is set and reshaped inputs carry the shape the
    model's configuration asks it to see.
    """
    prefix = f"[request id: {request.describe()}] "
    batched = model.max_batch_size > 0
    for name, tensor in request.inputs.items():
        spec = model.inputs.get(name)
        if spec is None:
            raise invalid(f"{prefix}unexpected inference input '{name}' for model '{model.name}'")
        _check_tensor(prefix, model.name, spec, tensor, batched)
    for spec in model.inputs.values():
        if spec.name not in request.inputs and not spec.optional:
            raise invalid(
                f"{prefix}expected {_required_count(model)} inputs but got "
                f"{len(request.inputs)} inputs for model '{model.name}'; "
                f"missing input '{spec.name}'"
            )
    request.batch_size = _batch_size(prefix, request, model) if batched else 1
    request.batched = batched
    if request.requested_outputs is not None:
        for output in request.requested_outputs:
            if output.name not in model.outputs:
                raise invalid(
                    f"{prefix}unexpected inference output '{output.name}' for model "
                    f"'{model.name}'"
                )
    _apply_reshapes(request, model, batched)


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


def _required_count(model: ModelHandle) -> int:
    return sum(1 for spec in model.inputs.values() if not spec.optional)


def _check_tensor(prefix: str, model: str, spec: TensorSpec, tensor: Tensor, batched: bool) -> None:
    if tensor.datatype is not spec.datatype:
        raise invalid(
            f"{prefix}inference input '{tensor.name}' data-type is '{tensor.datatype.wire}', "
            f"but model '{model}' expects '{spec.datatype.wire}'"
        )
    shape = tensor.shape[1:] if batched else tensor.shape
    if batched and not tensor.shape:
        raise invalid(f"{prefix}input '{tensor.name}' for model '{model}' has no batch dimension")
    if len(shape) != len(spec.dims) or any(
        want != -1 and want != got for want, got in zip(spec.dims, shape, strict=True)
    ):
        raise invalid(
            f"{prefix}unexpected shape for input '{tensor.name}' for model '{model}'. "
            f"Expected {_shape_text(spec.dims, batched)}, got {list(tensor.shape)}"
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
