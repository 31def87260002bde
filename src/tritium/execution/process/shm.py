"""Shared-memory arenas that carry tensors between the server and an instance process.

Each direction has one arena: a memfd both processes map, written only by its sender.
The sender allocates a block, copies the tensors of one message into it (the one copy),
and names the block in the message; the receiver builds numpy views of the block (no
copy), and when the last view is gone it clears the block's state byte. The sender
reclaims cleared blocks when it next allocates: freeing costs no message.

Small blocks come from a ring at the start of the arena (it restarts at offset 0 whenever
it empties, so a quiet arena touches few pages); large ones, and small ones while the ring
is full, from a first-fit region after it, whose freed pages stay mapped for the next
large tensor (no page faults on reuse). When neither has room the tensors travel inside
the message instead (a second copy).
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import math
import mmap
import os
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.serialization import bytes_from_binary, serialize_bytes
from tritium.core.types import BYTES, DataType
from tritium.core.types import Tensor as CoreTensor
from tritium.execution.process.codec import MAX_FRAME, FrameError
from tritium.execution.process.messages import EMPTY, Packed, TensorDesc

ALIGN = 64
HEADER = 64  # state byte at +0; the block's total size (u64) at +8
FREE, LIVE, WRAP = 0, 1, 2
DEFAULT_CAPACITY = int(os.environ.get("TRITIUM_PROCESS_ARENA_BYTES", 2 << 30))
RING_BYTES = 8 << 20
LARGE = 256 << 10  # blocks above this come from the large region
_SIZE = struct.Struct("<Q")


@dataclass(frozen=True, slots=True)
class ArenaLayout:
    """What --backend-config=python,... chose: the ring's size (shm-default-byte-size) and
    the memfd names' prefix (shm-region-prefix-name); set once at startup."""

    ring_bytes: int = RING_BYTES
    name_prefix: str = "tritium-"


_layout = ArenaLayout()


def configure(ring_bytes: int | None, name_prefix: str) -> None:
    global _layout
    ring = RING_BYTES if ring_bytes is None else _align(ring_bytes)
    # The ring sits inside the arena, next to the large-block region.
    _layout = ArenaLayout(min(ring, DEFAULT_CAPACITY // 2), name_prefix)


def layout() -> ArenaLayout:
    return _layout


# Inline tensors share the frame limit with the rest of their message.
MAX_INLINE = MAX_FRAME - (1 << 20)
# Tensors of a message up to this size travel inside it: copying them through the socket
# costs less than a block's bookkeeping on both sides (allocate, reclaim, a view's owner).
SMALL = 16 << 10


def _align(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)


def create_memfd(name: str, size: int) -> int:
    """A sparse memfd of ``size`` bytes: pages cost memory only once touched."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    return fd


class Mapping:
    """One process's mapping of an arena's memfd (never unmapped: views may outlive use)."""

    def __init__(self, fd: int, size: int) -> None:
        self.size = size
        self.mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.address = ctypes.addressof(ctypes.c_char.from_buffer(self.mm))
        self.bytes: np.ndarray | None = np.frombuffer(self.mm, dtype=np.uint8)

    def close(self) -> None:
        """Unmap, unless views of it are still alive (then the last one unmaps it)."""
        self.bytes = None
        with contextlib.suppress(BufferError):
            self.mm.close()


class _Block:
    """The owner of a received block's views: numpy keeps it as their base, and when the
    last view dies the block is handed back to its writer by clearing its state byte."""

    __slots__ = ("__array_interface__", "_mm", "_offset")

    def __init__(self, mapping: Mapping, offset: int, nbytes: int) -> None:
        self._mm = mapping.mm
        self._offset = offset
        self.__array_interface__ = {
            "data": (mapping.address + offset + HEADER, False),
            "shape": (nbytes,),
            "typestr": "|u1",
            "version": 3,
        }

    def __del__(self) -> None:
        self._mm[self._offset] = FREE


class ArenaWriter:
    """The sending side of an arena: allocates blocks and copies tensors into them."""

    def __init__(self, mapping: Mapping, ring_bytes: int = RING_BYTES) -> None:
        self._map = mapping
        self._mm = mapping.mm
        self._ring = min(ring_bytes, mapping.size)
        self._head = 0
        self._tail = 0
        self._live = 0  # ring blocks not reclaimed yet
        self._free: list[tuple[int, int]] = [(self._ring, mapping.size - self._ring)]
        self._large: dict[int, int] = {}  # large blocks lent out: offset -> size
        # A child sends from its main thread and from threads the model starts.
        self._lock = threading.Lock()

    # -- allocation ----------------------------------------------------------
    def allocate(self, nbytes: int) -> int:
        """The offset of a new LIVE block with ``nbytes`` of data, or -1 if none fits."""
        size = HEADER + _align(nbytes)
        with self._lock:
            if self._large:
                self._reclaim_large()
            offset = self._ring_allocate(size) if size <= LARGE else -1
            if offset < 0:
                # Large, or the ring is full (a receiver holding an old block stops the
                # ring reclaiming past it): the first-fit region takes blocks in any order.
                offset = self._large_allocate(size)
            if offset >= 0:
                self._mm[offset] = LIVE
                _SIZE.pack_into(self._mm, offset + 8, size)
        return offset

    def _ring_allocate(self, size: int) -> int:
        self._reclaim_ring()
        if self._live == 0:
            self._head = self._tail = 0
        head, tail, ring = self._head, self._tail, self._ring
        if head >= tail:
            if head + size <= ring:
                return self._take(head, size)
            if size < tail:
                if head < ring:
                    self._mm[head] = WRAP
                return self._take(0, size)
            return -1
        if head + size < tail:
            return self._take(head, size)
        return -1

    def _take(self, offset: int, size: int) -> int:
        self._head = offset + size
        self._live += 1
        return offset

    def _reclaim_ring(self) -> None:
        mm = self._mm
        while self._live:
            tail = self._tail
            if tail >= self._ring:
                self._tail = 0
                continue
            state = mm[tail]
            if state == WRAP:
                self._tail = 0
            elif state == FREE:
                self._tail = tail + _SIZE.unpack_from(mm, tail + 8)[0]
                self._live -= 1
            else:
                return

    def _large_allocate(self, size: int) -> int:
        for index, (offset, room) in enumerate(self._free):
            if room >= size:
                if room == size:
                    del self._free[index]
                else:
                    self._free[index] = (offset + size, room - size)
                self._large[offset] = size
                return offset
        return -1

    def _reclaim_large(self) -> None:
        mm = self._mm
        for offset in [o for o in self._large if mm[o] == FREE]:
            self._release_large(offset, self._large.pop(offset))

    def _release_large(self, offset: int, size: int) -> None:
        free = self._free
        index = bisect.bisect(free, (offset, 0))
        if index < len(free) and offset + size == free[index][0]:
            size += free.pop(index)[1]
        if index > 0 and free[index - 1][0] + free[index - 1][1] == offset:
            offset, size = free[index - 1][0], free[index - 1][1] + size
            index -= 1
            del free[index]
        free.insert(index, (offset, size))

    def close(self) -> None:
        self._map.close()

    # -- packing -------------------------------------------------------------
    def pack(self, tensors: Sequence[CoreTensor]) -> Packed:
        """``tensors`` inline when small; else copied into one block (inline after all
        when no block fits)."""
        if not tensors:
            return EMPTY
        descs: list[TensorDesc] = []
        total = 0
        for tensor in tensors:
            datatype = tensor.datatype
            data: bytes | memoryview
            if datatype is BYTES:
                data = serialize_bytes(tensor.data)
                nbytes = len(data)
            else:
                array = tensor.data
                nbytes = array.nbytes
                if nbytes <= SMALL:
                    # Its bytes in C order, whatever its strides: for a small array a copy
                    # costs less than numpy's buffer export (some 1.5k instructions).
                    data = array.tobytes()
                else:
                    # The buffer is copied into the block: its own flags cost no numpy call.
                    view = array.data
                    if not view.c_contiguous:
                        view = np.ascontiguousarray(array).data
                    data = view.cast("B")  # flat bytes, as a decoded frame's are
            total += (nbytes + ALIGN - 1) & ~(ALIGN - 1)
            descs.append(TensorDesc(tensor.name, datatype.code, tensor.shape, 0, nbytes, data))
        if total <= SMALL:
            return Packed(-1, descs)
        offset = self.allocate(total)
        if offset < 0:
            if total > MAX_INLINE:
                raise TritiumError(ErrorCode.UNAVAILABLE, (
                    f"tensors of {total} bytes fit neither the instance's arena nor a frame"))
            return Packed(-1, descs)
        mm = self._mm
        at = 0
        base = offset + HEADER
        for desc in descs:
            nbytes, buffer = desc.nbytes, desc.data
            if nbytes and buffer is not None:  # set above
                mm[base + at:base + at + nbytes] = buffer  # the one copy (a memcpy)
            desc.at, desc.data = at, None
            at += (nbytes + ALIGN - 1) & ~(ALIGN - 1)
        return Packed(offset, descs)

    def pack_buffers(self, buffers: Sequence[Any]) -> Packed:
        """Plain byte buffers (memoryviews, bytes) packed as UINT8 tensors."""
        tensors = [CoreTensor("", DataType.UINT8, (len(memoryview(b).cast("B")),),
                              np.frombuffer(b, dtype=np.uint8)) for b in buffers]
        return self.pack(tensors)


class InlineWriter(ArenaWriter):
    """A writer with no arena of its own: tensors travel inside the message (what a
    process forked by model code sends, through its instance process, to the server)."""

    def __init__(self) -> None:  # no mapping: nothing to allocate from
        self._lock = threading.Lock()

    def allocate(self, nbytes: int) -> int:
        return -1


class ArenaReader:
    """The receiving side: numpy views of received blocks, freed when the views are.

    Every offset and size a message names is checked against the arena before it is
    touched: the sender may be broken or hostile (``FrameError``)."""

    def __init__(self, mapping: Mapping) -> None:
        self._map = mapping

    def close(self) -> None:
        self._map.close()

    def block(self, offset: int, nbytes: int) -> np.ndarray:
        size = self._map.size
        if (offset < 0 or offset % ALIGN or nbytes < 0
                or offset + HEADER + nbytes > size):
            raise FrameError(f"a block of {nbytes} bytes at offset {offset} lies outside "
                             f"the arena of {size} bytes")
        return np.asarray(_Block(self._map, offset, nbytes))

    def unpack(self, packed: Packed) -> list[CoreTensor]:
        descs = packed.tensors
        if not descs:
            return []
        if packed.offset < 0:
            inline = []
            for desc in descs:  # a loop: before Python 3.12 a comprehension is a call
                inline.append(_inline(desc))
            return inline
        end = max(desc.at + desc.nbytes for desc in descs)
        flat = self.block(packed.offset, end)
        return [_tensor(flat, desc) for desc in descs]

    def unpack_buffers(self, packed: Packed) -> list[memoryview]:
        return [tensor.data.data for tensor in self.unpack(packed)]


def _inline(desc: TensorDesc) -> CoreTensor:
    """A tensor that came inside its message: an array viewing the frame's bytes."""
    data = desc.data
    datatype = _BY_CODE.get(desc.datatype)
    if data is None or datatype is None or datatype is BYTES:
        if data is None:
            raise FrameError(f"tensor '{desc.name}' is neither in a block nor inline")
        return _tensor(np.frombuffer(data, dtype=np.uint8), desc)  # checked on the way
    shape = desc.shape
    try:  # one numpy call: an array over the frame's bytes, refused if they are too few
        array = np.ndarray(shape, datatype.numpy, data)
    except (TypeError, ValueError):
        raise FrameError(f"tensor '{desc.name}' does not fit its block") from None
    # ... or too many (the array's own size costs less than math.prod of the shape).
    if array.nbytes != len(data):  # flat bytes (decoded, or as pack made them)
        raise FrameError(f"tensor '{desc.name}' does not fit its block")
    return CoreTensor(desc.name, datatype, shape, array)


def _tensor(flat: np.ndarray, desc: TensorDesc) -> CoreTensor:
    # The codec checked that no dimension, place or size is negative.
    name, shape, at, nbytes = desc.name, desc.shape, desc.at, desc.nbytes
    datatype = _BY_CODE.get(desc.datatype)
    count = math.prod(shape)
    if datatype is None or at + nbytes > len(flat):
        raise FrameError(f"tensor '{name}' does not fit its block")
    if datatype is BYTES:
        if count * 4 > nbytes:  # each element has a 4-byte length
            raise FrameError(f"tensor '{name}' does not fit its block")
        try:
            data = bytes_from_binary(flat[at:at + nbytes].data, count,
                                     f"for tensor '{name}'").reshape(shape)
        except (TritiumError, ValueError) as exc:
            raise FrameError(str(exc)) from None
    elif count * datatype.itemsize != nbytes:
        raise FrameError(f"tensor '{name}' does not fit its block")
    elif nbytes:
        data = np.ndarray(shape, datatype.numpy, flat, at)  # a view: its base keeps the block
    else:
        data = np.empty(shape, datatype.numpy)
    return CoreTensor(name, datatype, shape, data)


_BY_CODE = {datatype.code: datatype for datatype in DataType}
