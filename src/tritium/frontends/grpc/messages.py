"""A stream's DATA bytes to gRPC messages, and compressed messages inflated off the loop.

Pure splitting (``MessageReader``) and an ``inflate`` that runs zlib on a worker thread (zlib
lets go of the GIL while it works) in bounded steps, capped by the inflated size and counted
step by step in the byte budget, so a compression bomb costs neither the loop's time nor more
of the server's memory than its sender may hold.
"""

from __future__ import annotations

import asyncio
import gzip
import mmap
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np

_PREFIX = 5
_INFLATE_STEP = 4 * 1024 * 1024  # bytes produced per step on the worker
_MAPPED = 1024 * 1024  # an inflated piece this large gets a mapping of its own
_BIG_MESSAGE = 1 << 20  # messages this large are gathered in a buffer of their own
_inflater_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tritium-inflate")


class MessageTooLarge(Exception):
    def __init__(self, size: int, limit: int):
        super().__init__(f"received message larger than max ({size} vs. {limit})")


class BufferExhausted(ValueError):
    """An inflated message outgrew what its connection, peer or the server may hold."""


class Message(SimpleNamespace):
    """One request message as it came off the stream, ``Message(body=, compressed=)`` (a
    namespace's C initializer: no Python ``__init__`` per message)."""

    body: bytes | memoryview
    compressed: bool


class MessageReader:
    """Splits one stream's bytes into messages (1-byte flag, 4-byte length, body).

    Holds at most one incomplete message, whose announced size is checked against ``limit``
    as soon as its prefix is in. A big one is gathered in a buffer of its size from numpy
    (huge pages: freeing a GiB of them takes milliseconds, of a bytearray's ~70 ms, all
    with the GIL held).
    """

    __slots__ = ("buf", "filled", "limit", "whole")

    def __init__(self, limit: int):
        self.limit = limit
        # An incomplete message's bytes (read-only outside; empty when none is).
        self.buf = bytearray()
        # An incomplete big message (prefix included), and how much of it is in.
        self.whole: np.ndarray | None = None
        self.filled = 0

    def clear(self) -> None:
        self.buf = bytearray()
        self.whole = None
        self.filled = 0

    @property
    def partial(self) -> int:
        """Bytes of an incomplete message held."""
        return self.filled if self.whole is not None else len(self.buf)

    def feed(self, data: memoryview) -> list[Message]:
        if self.whole is not None:
            return self._fill(data)
        buf = self.buf
        if not buf and len(data) >= _PREFIX:
            size = int.from_bytes(data[1:5], "big")
            if len(data) == _PREFIX + size:  # usual: one whole message in this frame
                if size > self.limit:
                    raise MessageTooLarge(size, self.limit)
                return [Message(body=data[_PREFIX:], compressed=bool(data[0]))]
        buf += data
        found: list[Message] = []
        while len(buf) >= _PREFIX:
            size = int.from_bytes(buf[1:5], "big")
            self._check(size)
            end = _PREFIX + size
            if len(buf) < end:
                if size >= _BIG_MESSAGE:
                    self._gather(buf, end)
                break
            if len(buf) == end:  # the buffer is exactly this message: hand it over whole
                found.append(Message(body=memoryview(buf)[_PREFIX:], compressed=bool(buf[0])))
                buf = self.buf = bytearray()
                break
            found.append(Message(body=bytes(buf[_PREFIX:end]), compressed=bool(buf[0])))
            del buf[:end]
        return found

    def _check(self, size: int) -> None:
        if size > self.limit:
            raise MessageTooLarge(size, self.limit)

    def _gather(self, buf: bytearray, end: int) -> None:
        """Go on with the incomplete message at the start of ``buf`` in a buffer of its
        whole ``end`` bytes (only its pages that are written are ever held)."""
        self.whole = np.empty(end, np.uint8)
        self.whole[:len(buf)] = np.frombuffer(buf, np.uint8)
        self.filled = len(buf)
        self.buf = bytearray()

    def _fill(self, data: memoryview) -> list[Message]:
        whole, filled = self.whole, self.filled
        assert whole is not None
        take = min(len(data), whole.size - filled)
        whole[filled:filled + take] = np.frombuffer(data, np.uint8, take)
        self.filled = filled = filled + take
        if filled < whole.size:
            return []
        self.whole, self.filled = None, 0
        found = [Message(body=whole.data[_PREFIX:], compressed=bool(whole[0]))]
        if take < len(data):
            found.extend(self.feed(data[take:]))
        return found


async def inflate(data: bytes | memoryview, encoding: str, limit: int,
                  hold: Callable[[int], bool] | None = None) -> memoryview:
    """A compressed message's bytes; ValueError for an unknown encoding, corrupt data or a
    result over ``limit`` bytes. Runs on a worker thread, step by step; ``hold(n)`` counts
    each step's bytes in the byte budget, and a False from it ends the inflation with
    ``BufferExhausted`` (whoever passes ``hold`` releases what it counted)."""
    if encoding == "gzip":
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    elif encoding == "deflate":
        inflater = zlib.decompressobj()
    else:
        raise ValueError(f"message compressed with unsupported encoding '{encoding}'")
    loop = asyncio.get_running_loop()
    pieces: list[mmap.mmap | bytes] = []
    produced = 0
    pending: bytes | memoryview = data
    while True:
        step = min(_INFLATE_STEP, limit + 1 - produced)
        piece = await loop.run_in_executor(_inflater_pool, _inflate_step, inflater, pending,
                                           step, encoding)
        pieces.append(piece)
        produced += len(piece)
        if produced > limit:
            raise ValueError(f"decompressed message is larger than {limit} bytes")
        if hold is not None and piece and not hold(len(piece)):
            raise BufferExhausted(
                f"decompressed message does not fit in the server's request buffers "
                f"(more than {produced - len(piece)} bytes held for this client)")
        pending = inflater.unconsumed_tail
        if inflater.eof or (not pending and not piece):
            break
    if not inflater.eof or inflater.unused_data:
        raise ValueError(f"corrupt {encoding} message: truncated or followed by extra bytes")
    if len(pieces) == 1:
        return memoryview(pieces[0])
    return await loop.run_in_executor(_inflater_pool, _joined, pieces, produced)


def _inflate_step(inflater: zlib._Decompress, data: bytes | memoryview, step: int,
                  encoding: str) -> mmap.mmap | bytes:
    """One step's bytes, moved into a mapping of their own: zlib's result comes from
    malloc, and once a long-running process has freed a block that large malloc keeps
    such blocks in its heap, where a freed one in the middle is not given back; a message
    held as heap pieces then stayed held through the join (a 512 MiB message peaked at
    1030 MiB, measured). A mapping goes back to the system the moment it is closed, and
    each zlib result is freed before the next one is made, so the heap does not grow."""
    try:
        piece = inflater.decompress(data, step)
    except (zlib.error, gzip.BadGzipFile) as exc:
        raise ValueError(f"corrupt {encoding} message: {exc}") from None
    if len(piece) < _MAPPED:
        return piece  # small: malloc hands these back as any small block
    mapped = mmap.mmap(-1, len(piece))
    mapped.write(piece)
    return mapped


def _joined(pieces: list[mmap.mmap | bytes], size: int) -> memoryview:
    """``pieces`` as one buffer, each released once copied (never twice the message held).
    numpy copies with the GIL released, so the loop runs meanwhile: ``b"".join`` would
    hold it for the whole copy and its page faults."""
    whole = np.empty(size, np.uint8)
    pieces.reverse()
    at = 0
    while pieces:
        piece = pieces.pop()
        view = np.frombuffer(piece, np.uint8)
        whole[at:at + view.size] = view
        at += view.size
        del view
        if isinstance(piece, mmap.mmap):
            piece.close()
    return whole.data
