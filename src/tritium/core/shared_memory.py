"""System shared memory regions that clients register, and tensor bytes read from and
written to them (Triton's system shared memory extension), for both frontends.

A region is an open file descriptor on a POSIX shared memory object, never a mapping: the
object belongs to a client, who may shrink it at any time, and touching a mapping past the
end of its file kills the process with SIGBUS. ``pread``/``pwrite`` at the region's offset
instead return short or fail, and the file's size is checked before every use.

Unregistering closes the descriptor at once, or, while a read or write is under way, as
that call ends: a descriptor number is never closed under a call (and reused for another
file), and never left to the garbage collector. A request that still points at the region
afterwards is refused as if it had named no such region.

A region is a client's: it must belong to the server's own user with no write access for
others, and, where the operator set one, its key must start with the allowed prefix. Bytes
copied out of regions are counted while requests hold them, and a read bigger than a small
request's is never done on an event loop thread.
"""

from __future__ import annotations

import asyncio
import os
import stat
import threading
import weakref
from dataclasses import dataclass

import numpy as np

from tritium.core import messages, offload
from tritium.core.descriptors import default_region_cap
from tritium.core.errors import ErrorCode, TritiumError, invalid

try:
    import _posixshmem  # CPython's own binding of shm_open, as multiprocessing uses it
except ImportError:  # pragma: no cover - not a POSIX system
    _posixshmem = None

# Keys of the regions Triton's python backend makes for itself; a client may not name them.
RESERVED_PREFIX = "triton_python_backend_shm_region_"
EXTENSION = "system_shared_memory"
# The most one tensor reads out of a region: the bytes are copied, and a client can make a
# sparse object of any size at no cost of its own. gRPC's largest message, so a tensor too
# big for this could not have been sent any other way either.
MAX_READ_BYTES = 2**31 - 1
# Bytes read out of regions that the requests in flight may hold together: a few hundred
# bytes of request can name gigabytes of a sparse object that costs its client nothing.
MAX_BYTES_IN_FLIGHT = 4 * 2**30


class ReadOnLoop(Exception):
    """A read too big for an event loop thread was asked of one: decode off the loop."""


class BytesInFlight:
    """Bytes copied out of regions and still held by requests, with their bound."""

    def __init__(self, limit: int = MAX_BYTES_IN_FLIGHT):
        self.limit = limit
        self.held = 0
        self._lock = threading.Lock()

    def take(self, size: int) -> None:
        with self._lock:
            if self.held + size > self.limit:
                raise TritiumError(ErrorCode.UNAVAILABLE, messages.SHM_BUSY.format(
                    held=self.held, size=size, limit=self.limit))
            self.held += size

    def release(self, size: int) -> None:
        with self._lock:
            self.held -= size


@dataclass(frozen=True, slots=True)
class RegionStatus:
    """A registered region as status reports it."""

    name: str
    key: str
    offset: int
    byte_size: int


class Region:
    """One registered region: ``byte_size`` bytes from ``offset`` in the object ``key``."""

    __slots__ = ("_busy", "_closing", "_fd", "_flight", "_lock", "byte_size", "key", "name",
                 "offset", "writable")

    def __init__(self, name: str, key: str, offset: int, byte_size: int, fd: int,
                 writable: bool, flight: BytesInFlight | None = None):
        self._flight = flight or BytesInFlight()
        self.name = name
        self.key = key
        self.offset = offset
        self.byte_size = byte_size
        self.writable = writable
        self._fd = fd  # -1 once closed
        self._busy = 0  # reads and writes under way
        self._closing = False
        self._lock = threading.Lock()

    def status(self) -> RegionStatus:
        return RegionStatus(self.name, self.key, self.offset, self.byte_size)

    def close(self) -> None:
        """Close the descriptor now, or when the calls under way end."""
        with self._lock:
            self._closing = True
            if self._busy == 0 and self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def read(self, offset: int, size: int) -> memoryview:
        """``size`` bytes from ``offset`` within the region, copied (a writable buffer),
        counted in flight until the last view of them is gone."""
        fd = self._enter()
        try:
            self._check_file(fd, offset + size)
            self._flight.take(size)
            try:
                # Not zeroed first (bytearray would be, holding the GIL): the pages are
                # touched by preadv, which lets it go.
                data = np.empty(size, np.uint8)
                self._fill(fd, data.data, self.offset + offset)
            except BaseException:
                self._flight.release(size)
                raise
            weakref.finalize(data, self._flight.release, size)
            return data.data
        finally:
            self._leave()

    def _fill(self, fd: int, view: memoryview, start: int) -> None:
        done, size = 0, len(view)
        while done < size:
            got = os.preadv(fd, [view[done:]], start + done)
            if got <= 0:  # the file shrank between the check and the read
                raise self._shrunk(start + done, start + size)
            done += got

    def write(self, offset: int, data: bytes | memoryview) -> None:
        """``data`` into the region from ``offset`` (the caller checked that it fits)."""
        if not self.writable:
            raise TritiumError(ErrorCode.INTERNAL,
                               messages.SHM_READ_ONLY.format(name=self.name))
        fd = self._enter()
        try:
            self._check_file(fd, offset + len(data))
            view = memoryview(data).cast("B")
            done = 0
            while done < len(view):
                done += os.pwrite(fd, view[done:], self.offset + offset + done)
        finally:
            self._leave()

    def _enter(self) -> int:
        with self._lock:
            if self._closing:
                raise TritiumError(ErrorCode.NOT_FOUND,
                                   messages.SHM_UNKNOWN_REGION.format(name=self.name))
            self._busy += 1
            return self._fd

    def _leave(self) -> None:
        with self._lock:
            self._busy -= 1
            if self._busy == 0 and self._closing and self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def _check_file(self, fd: int, end: int) -> None:
        """The file still holds the region up to ``end`` (relative to the region)."""
        size = os.fstat(fd).st_size
        if size < self.offset + end:
            raise self._shrunk(size, self.offset + end)

    def _shrunk(self, size: int, needed: int) -> TritiumError:
        return invalid(messages.SHM_SHRUNK.format(name=self.name, size=size, needed=needed))


@dataclass(frozen=True, slots=True)
class Slice:
    """``byte_size`` bytes at ``offset`` in a region, as one tensor's parameters named them."""

    region: Region
    offset: int
    byte_size: int

    def __len__(self) -> int:
        return self.byte_size

    def read(self) -> memoryview:
        if self.byte_size > MAX_READ_BYTES:
            raise invalid(messages.SHM_READ_TOO_BIG.format(
                name=self.region.name, size=self.byte_size, limit=MAX_READ_BYTES))
        if self.byte_size > offload.INLINE_BYTES and _on_event_loop():
            raise ReadOnLoop
        return self.region.read(self.offset, self.byte_size)

    def write_output(self, output: str, data: bytes | memoryview) -> None:
        """An output's bytes into the slice, refused when they do not fit."""
        if len(data) > self.byte_size:
            raise TritiumError(ErrorCode.INTERNAL, messages.SHM_OUTPUT_TOO_SMALL.format(
                output=output, size=self.byte_size, needed=len(data)))
        self.region.write(self.offset, data)


class SharedMemoryRegistry:
    """The regions clients registered, by name. Thread-safe: requests are decoded (and
    responses encoded) on worker threads as well as on the event loop."""

    def __init__(self, allow_client: bool = False, max_regions: int | None = None,
                 key_prefix: str = "", max_bytes_in_flight: int = MAX_BYTES_IN_FLIGHT):
        self.allow_client = allow_client  # --allow-client-shm: off by default, as in Triton
        self.max_regions = max_regions or default_region_cap()
        # --client-shm-key-prefix: keys must start with it (leading "/" aside); "": any.
        self.key_prefix = key_prefix.lstrip("/")
        self.in_flight = BytesInFlight(max_bytes_in_flight)
        self._regions: dict[str, Region] = {}
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.allow_client and _posixshmem is not None

    # -- registration --------------------------------------------------------------
    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self._check_allowed()
        if not name:
            raise invalid(messages.SHM_NEEDS_NAME)
        _check_key(name, key)
        if not key.lstrip("/").startswith(self.key_prefix):
            raise invalid(messages.SHM_KEY_NOT_ALLOWED.format(name=name, key=key,
                                                              prefix="/" + self.key_prefix))
        with self._lock:
            if name in self._regions:
                raise TritiumError(ErrorCode.ALREADY_EXISTS,
                                   messages.SHM_ALREADY_REGISTERED.format(name=name))
            if len(self._regions) >= self.max_regions:
                raise invalid(messages.SHM_TOO_MANY.format(name=name, limit=self.max_regions))
            self._regions[name] = _open_region(name, key, offset, byte_size, self.in_flight)

    def unregister(self, name: str) -> None:
        """Forget ``name`` (nothing to do when it is not registered, as in Triton)."""
        self._check_allowed()
        with self._lock:
            region = self._regions.pop(name, None)
        if region is not None:
            region.close()

    def unregister_all(self) -> None:
        self._check_allowed()
        self.close()

    def close(self) -> None:
        """Forget every region (server shutdown)."""
        with self._lock:
            regions = list(self._regions.values())
            self._regions.clear()
        for region in regions:
            region.close()

    def status(self, name: str = "") -> list[RegionStatus]:
        """Every region, or the one named (NOT_FOUND if it is not registered)."""
        with self._lock:
            if not name:
                return [region.status() for region in self._regions.values()]
            region = self._regions.get(name)
        if region is None:
            raise TritiumError(ErrorCode.NOT_FOUND,
                               messages.SHM_UNKNOWN_STATUS.format(name=name))
        return [region.status()]

    # -- CUDA shared memory: this server has no GPU support -------------------------
    def register_cuda(self, name: str) -> None:
        """Always refused; gRPC says so whatever --allow-client-shm says, as Triton does
        (HTTP checks the flag and the name first)."""
        raise invalid(messages.CUDA_SHM_UNSUPPORTED.format(name=name))

    def cuda_status(self, name: str = "") -> list[RegionStatus]:
        if not name:
            return []
        with self._lock:
            system = name in self._regions
        text = messages.CUDA_SHM_IS_SYSTEM if system else messages.CUDA_SHM_UNKNOWN_STATUS
        raise TritiumError(ErrorCode.NOT_FOUND, text.format(name=name))

    def unregister_cuda(self, name: str = "") -> None:
        self._check_allowed()  # and then there is no CUDA region to forget

    # -- use by requests -----------------------------------------------------------
    def slice(self, name: str, offset: int, byte_size: int) -> Slice:
        """The part of region ``name`` a tensor's parameters point at, checked as Triton's
        ``GetMemoryInfo`` checks it."""
        with self._lock:
            region = self._regions.get(name)
        if region is None:
            raise TritiumError(ErrorCode.NOT_FOUND,
                               messages.SHM_UNKNOWN_REGION.format(name=name))
        if offset < 0 or offset >= region.byte_size:
            raise invalid(messages.SHM_BAD_OFFSET.format(name=name))
        if byte_size < 0 or offset + byte_size > region.byte_size:
            raise invalid(messages.SHM_BAD_RANGE.format(name=name))
        return Slice(region, offset, byte_size)

    def output_slice(self, name: str, offset: int, byte_size: int) -> Slice:
        """As ``slice``, for an output: the region must be writable."""
        found = self.slice(name, offset, byte_size)
        if not found.region.writable:
            raise invalid(messages.SHM_READ_ONLY.format(name=name))
        return found

    def _check_allowed(self) -> None:
        if not self.enabled:
            raise TritiumError(ErrorCode.UNSUPPORTED, messages.SHM_DISABLED)


def extensions(base: tuple[str, ...], registry: SharedMemoryRegistry) -> tuple[str, ...]:
    """The server's extensions, with system shared memory where Triton lists it (after
    model_configuration) when clients may register regions."""
    if not registry.enabled:
        return base
    at = base.index("model_configuration") + 1 if "model_configuration" in base else len(base)
    return (*base[:at], EXTENSION, *base[at:])


def _check_key(name: str, key: str) -> None:
    stripped = key.lstrip("/")
    if not stripped:
        raise invalid(messages.SHM_INVALID_KEY.format(name=name, key=key))
    if stripped.startswith(RESERVED_PREFIX):
        raise invalid(messages.SHM_RESERVED_KEY.format(name=name, key=key,
                                                       prefix=RESERVED_PREFIX))


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _open_region(name: str, key: str, offset: int, byte_size: int,
                 flight: BytesInFlight) -> Region:
    fd, writable = _open(key)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise TritiumError(ErrorCode.INTERNAL, messages.SHM_NOT_A_REGION.format(key=key))
        # Another user's object (world-readable, say), or one anyone may rewrite under the
        # server, is no client region of this server's.
        if info.st_uid != os.geteuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise invalid(messages.SHM_NOT_OURS.format(name=name, key=key))
        if offset < 0 or byte_size < 0 or offset + byte_size > info.st_size:
            raise invalid(messages.SHM_OUT_OF_BOUNDS.format(name=name))
        if byte_size == 0:
            raise invalid(messages.SHM_EMPTY.format(name=name))
    except BaseException:
        os.close(fd)
        raise
    return Region(name, key, offset, byte_size, fd, writable, flight)


def _open(key: str) -> tuple[int, bool]:
    """A descriptor on the object ``key``, read-write if the server may write it, else
    read-only (such a region serves inputs only). shm_open refuses names with an inner
    ``/`` and, in glibc, follows no symbolic link; O_NONBLOCK keeps a FIFO placed there
    from blocking the open (it is then refused as not a regular file)."""
    if "\x00" in key or _posixshmem is None:
        raise TritiumError(ErrorCode.INTERNAL, messages.SHM_CANNOT_OPEN.format(key=key))
    for flags, writable in ((os.O_RDWR, True), (os.O_RDONLY, False)):
        try:
            return _posixshmem.shm_open(key, flags | os.O_NONBLOCK, 0), writable
        except PermissionError:
            continue
        except (OSError, ValueError):
            break
    raise TritiumError(ErrorCode.INTERNAL, messages.SHM_CANNOT_OPEN.format(key=key))
