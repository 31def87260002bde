"""BF16 across DLPack: numpy has no bfloat16, so its uint16 capsules are relabelled.

numpy exports and imports DLPack capsules for every dtype it knows. A BF16 tensor is held
as its raw 16-bit patterns (uint16), so exporting it is numpy's uint16 capsule with the
dtype code changed to kDLBfloat, and importing a bfloat16 capsule is the reverse: relabel
it kDLUInt and let numpy import the same memory as uint16. The layout of a capsule's
DLTensor is fixed by the DLPack ABI, which is what makes the relabelling safe.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from tritium.backends.python.errors import TritonModelException
from tritium.core import messages

_LEGACY = b"dltensor"
_VERSIONED = b"dltensor_versioned"
# Byte offsets of DLDataType in DLTensor (after data, device, ndim), and of DLTensor in
# DLManagedTensorVersioned (after version, manager_ctx, deleter, flags).
_DTYPE_OFFSET = 20
_VERSIONED_TENSOR_OFFSET = 32
_UINT = 1
_BFLOAT = 4

_api = ctypes.pythonapi
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def export_bf16(raw: np.ndarray) -> Any:
    """A DLPack capsule of BF16 data held as uint16 (writable, C-contiguous)."""
    capsule = raw.__dlpack__()
    _relabel(capsule, _UINT, _BFLOAT)
    return capsule


def import_capsule(capsule: Any) -> tuple[np.ndarray, bool]:
    """The capsule's data as numpy, and whether it was BF16 (then given as uint16).

    Raises TritonModelException for data numpy cannot reach, such as GPU memory: tritium
    keeps every tensor in CPU memory, where Triton would take the GPU tensor as it is.
    """
    bf16 = _relabel(capsule, _BFLOAT, _UINT)
    try:
        return np.from_dlpack(_Capsule(capsule)), bf16
    except (BufferError, RuntimeError, TypeError, ValueError) as exc:
        raise TritonModelException(messages.PB_DLPACK_NOT_CPU.format(reason=exc)) from None


def is_capsule(value: object) -> bool:
    return type(value).__name__ == "PyCapsule"


def _relabel(capsule: Any, old_code: int, new_code: int) -> bool:
    """Change a 16-bit dtype code ``old_code`` to ``new_code``; False when it is not one."""
    dtype = _dtype_address(capsule)
    if dtype is None:
        return False
    code_bits = (ctypes.c_uint8 * 2).from_address(dtype)
    if code_bits[0] != old_code or code_bits[1] != 16:
        return False
    code_bits[0] = new_code
    return True


def _dtype_address(capsule: Any) -> int | None:
    if not is_capsule(capsule):
        return None
    if _api.PyCapsule_IsValid(capsule, _LEGACY):
        return int(_api.PyCapsule_GetPointer(capsule, _LEGACY)) + _DTYPE_OFFSET
    if _api.PyCapsule_IsValid(capsule, _VERSIONED):
        base = int(_api.PyCapsule_GetPointer(capsule, _VERSIONED))
        return base + _VERSIONED_TENSOR_OFFSET + _DTYPE_OFFSET
    return None  # already consumed ("used_dltensor"): numpy will say so


class _Capsule:
    """Lets numpy import a bare DLPack capsule (as older frameworks hand out)."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        # numpy reads the true device from the capsule and refuses non-CPU data there.
        return (1, 0)
