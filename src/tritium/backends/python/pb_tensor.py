"""pb_utils.Tensor over a core Tensor, and Triton's numpy type helpers."""

from __future__ import annotations

import struct
import sys
from typing import Any

import numpy as np

from tritium.backends.python import arguments, dlpack
from tritium.backends.python.errors import TritonModelException
from tritium.core import messages
from tritium.core.types import BF16, DataType
from tritium.core.types import Tensor as CoreTensor

TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

# TRITONSERVER_DataType codes 1..13; BF16 (14) has no numpy type.
_CODE_TO_NUMPY: dict[int, Any] = {
    t.code: (np.bool_ if t is DataType.BOOL else t.numpy.type)
    for t in DataType
    if t is not DataType.BF16
}
_CPU_DEVICE = (1, 0)  # kDLCPU, device 0
# The numpy dtypes that map straight to a Triton type (not BYTES, not BF16).
_NUMERIC: dict[np.dtype, DataType] = {
    t.numpy: t for t in DataType if t not in (DataType.BYTES, DataType.BF16)
}


class Tensor:
    """A named tensor. Wraps the core tensor itself, so no data is copied either way."""

    __slots__ = ("_core",)

    def __init__(self, name: str | bytes, data: Any) -> None:
        # Made for every output of every request: a str name and a numeric array are
        # recognised by exact type and dict tests; anything else takes the full checks.
        text = name if type(name) is str else arguments.text("Tensor.__init__()", "name", name)
        array = data if isinstance(data, np.ndarray) else _as_array(data)
        if not text:
            raise TritonModelException(messages.PB_EMPTY_TENSOR_NAME)
        datatype = _NUMERIC.get(array.dtype)
        if datatype is None:
            self._core = _other_dtype_core(text, array)
            return
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        self._core = CoreTensor(text, datatype, array.shape, array)

    @classmethod
    def _wrap(cls, core: CoreTensor) -> Tensor:
        tensor = cls.__new__(cls)
        tensor._core = core
        return tensor

    def name(self) -> str:
        return self._core.name

    def as_numpy(self) -> np.ndarray:
        if self._core.datatype is BF16:
            # As Triton: numpy has no bfloat16 of its own, models take BF16 through DLPack.
            raise TritonModelException(messages.PB_BF16_AS_NUMPY)
        data = self._core.data
        return data if data.flags.writeable else self._own_copy()

    def shape(self) -> list[int]:
        return list(self._core.shape)

    def triton_dtype(self) -> int:
        return self._core.datatype.code

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        source = self._dlpack_source()
        if self._core.datatype is BF16:
            return dlpack.export_bf16(source)
        return source.__dlpack__()

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        return self.to_dlpack()

    def __dlpack_device__(self) -> tuple[int, int]:
        return _CPU_DEVICE

    @staticmethod
    def from_dlpack(name: str | bytes, tensor: Any) -> Tensor:
        text = name if type(name) is str else arguments.text("from_dlpack()", "name", name)
        if not text:
            raise TritonModelException(messages.PB_EMPTY_TENSOR_NAME)
        if dlpack.is_capsule(tensor):
            capsule = tensor
        elif hasattr(tensor, "__dlpack__") and hasattr(tensor, "__dlpack_device__"):
            # Taken here, not by numpy, so that a bfloat16 capsule can be relabelled.
            capsule = tensor.__dlpack__()
        else:
            raise TritonModelException(messages.PB_NOT_DLPACK)
        array, bf16 = dlpack.import_capsule(capsule)
        return Tensor(name, array.view(_bfloat16()) if bf16 else array)

    def __repr__(self) -> str:
        core = self._core
        return f"Tensor({core.name!r}, {core.datatype.wire}, {list(core.shape)})"

    def _dlpack_source(self) -> np.ndarray:
        if self._core.datatype is DataType.BYTES:
            raise TritonModelException("DLPack does not support BYTES tensors")
        data = self._core.data
        return data if data.flags.writeable else self._own_copy()

    def _own_copy(self) -> np.ndarray:
        """Replace read-only data by a writable copy, once: later calls see that copy.

        Binary inputs are views of immutable request bytes (the HTTP body, gRPC raw
        contents). Triton hands models writable tensors, models write into them, and
        DLPack consumers such as torch refuse to import a read-only array. Copying when
        the model first reaches the data keeps the frontends zero-copy and costs one
        memcpy per input only for data that was read-only.
        """
        data = self._core.data.copy()
        self._core.data = data
        return data


def _other_dtype_core(name: str, array: np.ndarray) -> CoreTensor:
    """The core tensor of an array whose dtype is not one of ``_NUMERIC``'s."""
    if _is_bfloat16(array.dtype):
        # Kept as the raw 16-bit patterns, as the core stores BF16.
        array = np.ascontiguousarray(array).view(np.uint16)
        return CoreTensor(name, DataType.BF16, array.shape, array)
    datatype = DataType.from_numpy(array.dtype)
    if datatype is None:
        raise TritonModelException(
            f"tensor '{name}': numpy dtype '{array.dtype}' has no Triton data type"
        )
    if datatype is DataType.BYTES:
        array = _as_bytes_array(array)
    elif not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    return CoreTensor(name, datatype, array.shape, array)


def _bfloat16() -> np.dtype:
    # Imported for the first BF16 tensor only: ml_dtypes costs an instance process ~2 MiB.
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def _is_bfloat16(dtype: np.dtype) -> bool:
    # No array is bfloat16 before ml_dtypes is imported (by the model, or by _bfloat16).
    ml_dtypes = sys.modules.get("ml_dtypes")
    return ml_dtypes is not None and dtype == ml_dtypes.bfloat16


def _as_array(data: Any) -> np.ndarray:
    # Triton binds ``py::array``, which pybind11 loads only from an ndarray: lists, scalars
    # and None are refused before Triton's code runs.
    raise arguments.incompatible("Tensor.__init__()", "data", "a numpy.ndarray", data)


def _as_bytes_array(array: np.ndarray) -> np.ndarray:
    """BYTES tensors hold ``bytes`` elements; str (and other objects) are encoded UTF-8."""
    if array.dtype.kind == "S":
        return array.astype(np.object_)
    if array.dtype.kind == "O" and all(type(item) is bytes for item in array.flat):
        return array
    out = np.empty(array.shape, dtype=np.object_)
    out.flat[:] = [_to_bytes(item) for item in array.flat]
    return out


def _to_bytes(item: Any) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, (bytearray, memoryview, np.bytes_)):
        return bytes(item)
    return str(item).encode("utf-8")


def triton_string_to_numpy(triton_type_string: str) -> Any:
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> Any:
    """The numpy type of a TRITONSERVER_DataType code, None when there is none."""
    return _CODE_TO_NUMPY.get(data_type)


def numpy_to_triton_type(data_type: Any) -> int | None:
    """The TRITONSERVER_DataType code of a numpy type, None when there is none."""
    try:
        dtype = np.dtype(data_type)
    except TypeError:
        return None
    if dtype.kind in "OS":
        return DataType.BYTES.code
    datatype = DataType.from_numpy(dtype)
    return None if datatype is None or datatype is DataType.BYTES else datatype.code


def serialize_byte_tensor(input_tensor: np.ndarray) -> Any:
    """Length-prefixed (uint32 LE) elements in C order; () when empty, None when not bytes."""
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype.kind not in "OS":
        return None
    parts: list[bytes] = []
    for item in input_tensor.flatten(order="C"):
        data = item if type(item) is bytes else _serialized_element(item, input_tensor.dtype)
        parts.append(struct.pack("<I", len(data)))
        parts.append(data)
    return b"".join(parts)


def _serialized_element(item: Any, dtype: np.dtype) -> bytes:
    # Fixed-width np.bytes_ elements are taken as they are; objects are printed as text.
    if dtype.kind == "S":
        return bytes(item)
    return str(item).encode("utf-8")


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """The inverse of ``serialize_byte_tensor``: a 1-D object array of ``bytes``."""
    items: list[bytes] = []
    view = memoryview(encoded_tensor).cast("B")
    offset = 0
    while offset < len(view):
        (length,) = struct.unpack_from("<I", view, offset)
        offset += 4
        items.append(bytes(view[offset : offset + length]))
        offset += length
    out = np.empty(len(items), dtype=np.object_)
    out[:] = items
    return out
