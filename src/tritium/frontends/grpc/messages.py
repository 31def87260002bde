"""A stream's DATA bytes to gRPC messages, and compressed messages inflated off the loop.

Pure splitting (``MessageReader``) and an ``inflate`` that runs zlib on a worker thread (zlib
lets go of the GIL while it works) in bounded steps, capped by the inflated size, so a
compression bomb costs neither the loop's time nor the server's memory.
"""

from __future__ import annotations

import asyncio
import gzip
import zlib
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

_PREFIX = 5
_INFLATE_STEP = 4 * 1024 * 1024  # bytes produced per step on the worker
_inflater_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tritium-inflate")


class MessageTooLarge(Exception):
    def __init__(self, size: int, limit: int):
        super().__init__(f"received message larger than max ({size} vs. {limit})")


class Message(SimpleNamespace):
    """One request message as it came off the stream, ``Message(body=, compressed=)`` (a
    namespace's C initializer: no Python ``__init__`` per message)."""

    body: bytes | memoryview
    compressed: bool


class MessageReader:
    """Splits one stream's bytes into messages (1-byte flag, 4-byte length, body).

    Holds at most one incomplete message, whose announced size is checked against ``limit``
    as soon as its prefix is in.
    """

    __slots__ = ("buf", "limit")

    def __init__(self, limit: int):
        self.limit = limit
        # An incomplete message's bytes (read-only outside; empty when none is).
        self.buf = bytearray()

    def clear(self) -> None:
        self.buf = bytearray()

    @property
    def partial(self) -> int:
        """Bytes of an incomplete message held."""
        return len(self.buf)

    def feed(self, data: memoryview) -> list[Message]:
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


async def inflate(data: bytes | memoryview, encoding: str, limit: int) -> bytes:
    """A compressed message's bytes; ValueError for an unknown encoding, corrupt data or a
    result over ``limit`` bytes. Runs on a worker thread, step by step."""
    if encoding == "gzip":
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    elif encoding == "deflate":
        inflater = zlib.decompressobj()
    else:
        raise ValueError(f"message compressed with unsupported encoding '{encoding}'")
    loop = asyncio.get_running_loop()
    pieces: list[bytes] = []
    produced = 0
    pending: bytes | memoryview = data
    while True:
        step = min(_INFLATE_STEP, limit + 1 - produced)
        piece = await loop.run_in_executor(_inflater_pool, _inflate_step, inflater, pending, step,
                                           encoding)
        pieces.append(piece)
        produced += len(piece)
        if produced > limit:
            raise ValueError(f"decompressed message is larger than {limit} bytes")
        pending = inflater.unconsumed_tail
        if inflater.eof or (not pending and not piece):
            break
    if not inflater.eof or inflater.unused_data:
        raise ValueError(f"corrupt {encoding} message: truncated or followed by extra bytes")
    return b"".join(pieces)


def _inflate_step(inflater: zlib._Decompress, data: bytes | memoryview, step: int,
                  encoding: str) -> bytes:
    try:
        return inflater.decompress(data, step)
    except (zlib.error, gzip.BadGzipFile) as exc:
        raise ValueError(f"corrupt {encoding} message: {exc}") from None
