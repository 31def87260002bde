"""Top-N classification of an output tensor into BYTES "<value>:<index>[:<label>]" strings."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from tritium.core.errors import invalid
from tritium.core.serialization import bytes_array, wire_array
from tritium.core.types import DataType, Tensor

_CLASSIFIABLE = frozenset(t for t in DataType if t.numpy.kind in "iuf") - {
    DataType.FP16,
    DataType.BF16,
}


def classify(
    tensor: Tensor, count: int, batched: bool, labels: Mapping[str, Sequence[str]] | None
) -> Tensor:
    """The top ``count`` classes of each batch entry as BYTES "<value>:<index>[:<label>]"."""
    if tensor.datatype not in _CLASSIFIABLE:
        raise invalid(
            "class result not available for output due to unsupported type "
            f"'{tensor.datatype.wire}'"
        )
    shape = tensor.shape
    rows = shape[0] if batched and shape else 1
    per_row = math.prod(shape[1:]) if batched and shape else math.prod(shape)
    values = wire_array(tensor).reshape(rows, per_row)
    names = labels.get(tensor.name) if labels else None
    fmt = "%f" if values.dtype.kind == "f" else "%d"
    top = min(count, per_row)
    classes: list[bytes] = []
    for row in values:
        for index in np.argsort(-row.astype(np.float64), kind="stable")[:top].tolist():
            text = (fmt % row[index]) + f":{index}"
            if names is not None and index < len(names):
                text += f":{names[index]}"
            classes.append(text.encode("utf-8"))
    out_shape = (rows, top) if batched and shape else (top,)
    return Tensor(tensor.name, DataType.BYTES, out_shape, bytes_array(classes).reshape(out_shape))
