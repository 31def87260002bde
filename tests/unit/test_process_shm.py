"""Shared-memory arenas (blocks handed back by a state byte) and the cancel flag table."""

from __future__ import annotations

import asyncio
import gc
import itertools
import os

import ml_dtypes
import numpy as np
import pytest

from tritium.core.cancellation import Cancellation, CancelReason
from tritium.core.types import DataType, Tensor
from tritium.execution.process import messages as msg
from tritium.execution.process.codec import FrameError, FrameReader, decode, encode
from tritium.execution.process.flags import FlagTable, FlagView
from tritium.execution.process.shm import (
    LARGE,
    SMALL,
    ArenaReader,
    ArenaWriter,
    Mapping,
    create_memfd,
)

SIZE = 16 << 20
RING = 1 << 20


@pytest.fixture
def arena() -> tuple[ArenaWriter, ArenaReader]:
    """A writer and a reader over one memfd, as the two processes map it."""
    fd = create_memfd("test", SIZE)
    try:
        return ArenaWriter(Mapping(fd, SIZE), ring_bytes=RING), ArenaReader(Mapping(fd, SIZE))
    finally:
        os.close(fd)


def _tensor(name: str, data: np.ndarray, datatype: DataType | None = None) -> Tensor:
    datatype = datatype or DataType.from_numpy(data.dtype)
    assert datatype is not None
    return Tensor(name, datatype, tuple(data.shape), data)


def test_every_datatype_round_trips(arena: tuple[ArenaWriter, ArenaReader]) -> None:
    writer, reader = arena
    sent = [
        _tensor("b", np.array([True, False])),
        _tensor("u8", np.arange(5, dtype=np.uint8)),
        _tensor("i64", np.arange(-3, 3, dtype=np.int64).reshape(2, 3)),
        _tensor("f16", np.array([1.5, -2], dtype=np.float16)),
        _tensor("f64", np.array([[np.pi]])),
        _tensor("s", np.array([b"ab", b"", b"\x00\xff" * 100], dtype=np.object_), DataType.BYTES),
        _tensor("bf", np.array([1.5, -3], dtype=ml_dtypes.bfloat16).view(np.uint16),
                DataType.BF16),
        _tensor("empty", np.zeros((0, 4), dtype=np.float32)),
    ]
    got = reader.unpack(writer.pack(sent))
    assert [(t.name, t.datatype, t.shape) for t in got] == \
        [(t.name, t.datatype, t.shape) for t in sent]
    for before, after in zip(sent, got, strict=True):
        assert after.data.dtype == before.data.dtype
        assert after.data.tolist() == before.data.tolist()


def test_received_tensors_are_writable_views_of_the_arena(
        arena: tuple[ArenaWriter, ArenaReader]) -> None:
    """No copy on the receiving side: the array is the shared memory (and a model may
    write into its inputs, as Triton lets it)."""
    writer, reader = arena
    (got,) = reader.unpack(writer.pack([_tensor("x", np.arange(SMALL, dtype=np.float32))]))
    assert got.data.flags.writeable and not got.data.flags.owndata
    got.data[0] = 42.0
    (again,) = reader.unpack(writer.pack([_tensor("x", np.arange(SMALL, dtype=np.float32))]))
    assert again.data[0] == 0.0  # a second block, not the first one reused while alive


def test_a_block_is_reused_once_its_views_are_gone(
        arena: tuple[ArenaWriter, ArenaReader]) -> None:
    writer, reader = arena
    packed = writer.pack([_tensor("x", np.arange(SMALL, dtype=np.int32))])
    first = reader.unpack(packed)
    view = first[0].data[1:]  # a view of a view keeps the block too
    del first
    gc.collect()
    second = writer.pack([_tensor("y", np.arange(SMALL, dtype=np.int32))])
    assert second.offset != packed.offset
    reader.unpack(second)  # received and dropped at once
    del view
    gc.collect()
    # Both blocks are free now: the ring is empty and starts over at offset 0.
    assert writer.pack([_tensor("z", np.arange(SMALL, dtype=np.int32))]).offset == 0


def test_the_ring_wraps_to_its_start(arena: tuple[ArenaWriter, ArenaReader]) -> None:
    """Never empty (each block is held until the next one is sent), the ring reclaims from
    its oldest block and wraps to the start when its end has no room."""
    writer, reader = arena
    chunk = np.full(100_000, 7, dtype=np.uint8)
    previous = reader.unpack(writer.pack([_tensor("x", chunk)]))
    offsets = []
    for _ in range(40):  # 40 x ~100 KB through a 1 MiB ring
        packed = writer.pack([_tensor("x", chunk)])
        offsets.append(packed.offset)
        current = reader.unpack(packed)
        assert int(previous[0].data.sum()) == 7 * chunk.size  # not overwritten
        previous = current
    assert all(0 <= offset < RING for offset in offsets)
    assert any(b < a for a, b in itertools.pairwise(offsets))  # it wrapped


def test_a_block_held_for_long_does_not_stop_the_others(
        arena: tuple[ArenaWriter, ArenaReader]) -> None:
    """A model keeping an input forever holds the ring's oldest block: once the ring is
    full, blocks come from the first-fit region instead, never over the held one and
    never inline."""
    writer, reader = arena
    chunk = np.full(100_000, 1, dtype=np.uint8)
    held = reader.unpack(writer.pack([_tensor("keep", chunk)]))
    for _ in range(40):
        packed = writer.pack([_tensor("x", np.zeros(100_000, dtype=np.uint8))])
        assert packed.offset > 0 and all(t.data is None for t in packed.tensors)
        reader.unpack(packed)  # dropped at once
    assert int(held[0].data.sum()) == chunk.size


def test_large_blocks_come_from_their_own_region_and_merge_when_freed(
        arena: tuple[ArenaWriter, ArenaReader]) -> None:
    writer, reader = arena
    big = np.ones(LARGE * 2, dtype=np.uint8)
    a = reader.unpack(writer.pack([_tensor("a", big)]))
    b = reader.unpack(writer.pack([_tensor("b", big)]))
    offset_a = a[0].data.__array_interface__["data"][0]
    assert a[0].data.sum() == big.size and b[0].data.sum() == big.size
    del a, b
    gc.collect()
    bigger = np.ones(LARGE * 4 + 4096, dtype=np.uint8)  # fits only if a and b merged
    packed = writer.pack([_tensor("c", bigger)])
    assert packed.offset >= RING
    (c,) = reader.unpack(packed)
    assert c.data.__array_interface__["data"][0] == offset_a


def test_what_no_block_holds_travels_inline(arena: tuple[ArenaWriter, ArenaReader]) -> None:
    """Bigger than the arena: the bytes go in the message instead (correct, one copy more)."""
    writer, reader = arena
    huge = np.arange(SIZE // 4, dtype=np.int32)
    packed = writer.pack([_tensor("huge", huge)])
    assert packed.offset == -1 and packed.tensors[0].data is not None
    (got,) = reader.unpack(packed)
    assert np.array_equal(got.data, huge)


def test_small_tensors_travel_inline(arena: tuple[ArenaWriter, ArenaReader]) -> None:
    """A message's few small tensors go inside it: no block is taken for them, and they
    arrive whole through the codec (the arrays view the frame)."""
    writer, reader = arena
    small = np.arange(16, dtype=np.float32).reshape(1, 16)
    text = np.array([b"a", b"bc"], dtype=np.object_)
    packed = writer.pack([_tensor("x", small), Tensor("t", DataType.BYTES, (2,), text)])
    assert packed.offset == -1
    frames = FrameReader()
    frames.feed(encode(msg.Execute(1, [], packed)))
    crossed = decode(frames.bodies(1)[0])
    got = reader.unpack(crossed.inputs)
    assert np.array_equal(got[0].data, small) and got[0].shape == (1, 16)
    got[0].data[0, 0] = 42.0  # writable, as inputs in the arena are
    assert list(got[1].data) == [b"a", b"bc"]
    big = np.zeros(SMALL + 1, dtype=np.uint8)
    assert writer.pack([_tensor("big", big)]).offset >= 0


def test_strided_tensors_cross_in_order(arena: tuple[ArenaWriter, ArenaReader]) -> None:
    """A non-contiguous array (a transposed view) crosses as its values in row-major order,
    inline and through a block alike."""
    writer, reader = arena
    for rows in (4, 256):  # inline, then above SMALL
        source = np.arange(rows * 8, dtype=np.float32).reshape(8, rows).T
        assert not source.flags.c_contiguous
        (got,) = reader.unpack(writer.pack([_tensor("t", source)]))
        assert np.array_equal(got.data, source) and got.shape == (rows, 8)


@pytest.mark.parametrize("nbytes", [60, 68])
def test_an_inline_tensor_whose_bytes_do_not_fit_its_shape_is_refused(
        arena: tuple[ArenaWriter, ArenaReader], nbytes: int) -> None:
    """A [1, 16] FP32 tensor must come with exactly 64 bytes: fewer or more, and the sender
    is broken or hostile (FrameError), not a view over the wrong bytes."""
    _, reader = arena
    desc = msg.TensorDesc("x", DataType.FP32.code, (1, 16), 0, nbytes,
                          memoryview(bytearray(nbytes)))
    with pytest.raises(FrameError, match="does not fit"):
        reader.unpack(msg.Packed(-1, [desc]))


def test_buffers_round_trip(arena: tuple[ArenaWriter, ArenaReader]) -> None:
    writer, reader = arena
    buffers = reader.unpack_buffers(writer.pack_buffers([b"abc", memoryview(b"\x00" * 1000)]))
    assert [bytes(b) for b in buffers] == [b"abc", b"\x00" * 1000]


def test_a_request_given_a_slot_again_keeps_its_flag_following_the_new_one() -> None:
    """A rescheduled request takes a new slot while its old one may still be held: giving
    the old one back later does not stop the new one from following its cancel."""
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        table = FlagTable(8)
        view = FlagView(table.fd, 8)
        cancellation = Cancellation(loop)
        old = table.acquire(cancellation)
        new = table.acquire(cancellation)
        table.release(old, cancellation)
        cancellation.cancel(CancelReason.CLIENT_DISCONNECTED)
        assert view.cancellation(new).reason is CancelReason.CLIENT_DISCONNECTED
        assert not view.cancellation(old).is_cancelled()
        table.close()

    asyncio.run(scenario())


def test_a_cancel_flips_the_childs_flag_at_once() -> None:
    """The flag is set by the cancellation's own callback on the loop: the child reads it
    without any message; a slot given back ignores its old request's later cancel."""
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        table = FlagTable(8)
        view = FlagView(table.fd, 8)
        first, second = Cancellation(loop), Cancellation(loop)
        slot = table.acquire(first)
        child = view.cancellation(slot)
        assert not child.is_cancelled() and child.reason is None
        first.cancel(CancelReason.CLIENT_CANCELLED)
        assert child.is_cancelled() and child.reason is CancelReason.CLIENT_CANCELLED
        table.release(slot, first)
        reused = table.acquire(second)
        assert reused == slot and not view.cancellation(reused).is_cancelled()
        late = Cancellation(loop)
        old = table.acquire(late)
        table.release(old, late)
        taken = table.acquire(Cancellation(loop))
        late.cancel(CancelReason.DEADLINE)  # after its slot went to another request
        assert not view.cancellation(taken).is_cancelled()
        table.close()

    asyncio.run(scenario())
