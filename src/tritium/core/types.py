"""Shared vocabulary: data types, tensors and tensor specifications."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec
import numpy as np

_BY_WIRE: dict[str, DataType] = {}  # filled once the members exist, below


# On Python 3.11 reading an enum member off its class (``DataType.BYTES``) goes through
# EnumType's Python-level ``__getattr__``: ~75 ns, some ten times a module global's read. Code
# that runs for every request reads the members it needs through module globals instead
# (``BYTES`` and ``BF16`` below, imported where they are compared); so do the frontends for
# their own enums.
class DataType(enum.Enum):
    """A Triton tensor data type: wire name, config name, numpy dtype, size, C enum."""

    BOOL = ("BOOL", "TYPE_BOOL", np.dtype(np.bool_), 1, 1)
    UINT8 = ("UINT8", "TYPE_UINT8", np.dtype(np.uint8), 1, 2)
    UINT16 = ("UINT16", "TYPE_UINT16", np.dtype(np.uint16), 2, 3)
    UINT32 = ("UINT32", "TYPE_UINT32", np.dtype(np.uint32), 4, 4)
    UINT64 = ("UINT64", "TYPE_UINT64", np.dtype(np.uint64), 8, 5)
    INT8 = ("INT8", "TYPE_INT8", np.dtype(np.int8), 1, 6)
    INT16 = ("INT16", "TYPE_INT16", np.dtype(np.int16), 2, 7)
    INT32 = ("INT32", "TYPE_INT32", np.dtype(np.int32), 4, 8)
    INT64 = ("INT64", "TYPE_INT64", np.dtype(np.int64), 8, 9)
    FP16 = ("FP16", "TYPE_FP16", np.dtype(np.float16), 2, 10)
    FP32 = ("FP32", "TYPE_FP32", np.dtype(np.float32), 4, 11)
    FP64 = ("FP64", "TYPE_FP64", np.dtype(np.float64), 8, 12)
    BYTES = ("BYTES", "TYPE_STRING", np.dtype(np.object_), 0, 13)
    # numpy has no bfloat16; the raw 16-bit patterns are kept as uint16.
    BF16 = ("BF16", "TYPE_BF16", np.dtype(np.uint16), 2, 14)

    def __init__(self, wire: str, config: str, numpy: np.dtype, itemsize: int, code: int):
        self.wire = wire
        self.config = config
        self.numpy = numpy
        self.itemsize = itemsize
        self.code = code

    # Members are singletons: identity hashes in C, where Enum's own hash runs Python for
    # every lookup keyed by a data type (one per input of every gRPC request).
    __hash__ = object.__hash__

    if TYPE_CHECKING:
        @staticmethod
        def from_wire(name: str) -> DataType | None:
            """The data type named ``name`` on the wire; None for an unknown name."""
    else:
        # The wire-name table's own ``get``: the lookup every input of every request makes
        # runs no Python frame.
        from_wire = staticmethod(_BY_WIRE.get)

    @classmethod
    def from_config(cls, name: str) -> DataType | None:
        return _BY_CONFIG.get(name)

    @classmethod
    def from_numpy(cls, dtype: np.dtype) -> DataType | None:
        if dtype.kind in "SUO":
            return cls.BYTES
        return _BY_NUMPY.get(dtype)

    @classmethod
    def from_code(cls, code: int) -> DataType | None:
        return _BY_CODE.get(code)


_BY_WIRE.update((t.wire, t) for t in DataType)
_BY_CONFIG = {t.config: t for t in DataType}
_BY_CODE = {t.code: t for t in DataType}
_BY_NUMPY = {t.numpy: t for t in DataType if t is not DataType.BF16}


BYTES, BF16 = DataType.BYTES, DataType.BF16  # the members per-request code compares with


class Tensor(msgspec.Struct):
    """A named tensor. ``data`` is a numpy array of ``datatype.numpy`` shaped ``shape``;
    BYTES elements are ``bytes`` objects in an object array. (A Struct: made in C, with
    no Python ``__init__`` frame, for every input and output.)"""

    name: str
    datatype: DataType
    shape: tuple[int, ...]
    data: np.ndarray

    @property
    def element_count(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """A tensor as a model's configuration declares it (``dims`` exclude the batch dim)."""

    name: str
    datatype: DataType
    dims: tuple[int, ...]
    optional: bool = False
    reshape: tuple[int, ...] | None = None
    # Worked out once for the check every input of every request gets: how many ``dims``
    # there are, and the positions that are not -1 (where an input's shape must match).
    rank: int = field(init=False, repr=False, compare=False)
    fixed: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Frozen: set once, here.
        object.__setattr__(self, "rank", len(self.dims))
        object.__setattr__(self, "fixed",
                           tuple(i for i, want in enumerate(self.dims) if want != -1))
