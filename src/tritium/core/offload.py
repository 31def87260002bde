"""Work that grows with a request's size, run off the event loop on a small thread pool.

Decoding a 64 MiB request or encoding a big response takes the loop for seconds if done on
it, stalling every other client. The codecs do such work in bounded slices (no single C call
holds the GIL for more than a few milliseconds), so on a worker thread it lets the loop run
in between. Small requests stay inline: a thread hop costs more than their whole decode.
"""

from __future__ import annotations

import asyncio
import functools
import operator
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from tritium.core.response import InferenceResponse

# Requests and responses below this many bytes (or elements) are coded on the loop.
INLINE_BYTES = 256 * 1024
# Two workers: one hostile request cannot hold up every other big one, and the GIL keeps
# more from running at once anyway.
WORKERS = 2

T = TypeVar("T")

_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_initializer: Callable[[], None] | None = None


def heavy(size: int) -> bool:
    """Whether coding ``size`` bytes is worth a trip to a worker thread (hot paths compare
    with ``INLINE_BYTES`` themselves)."""
    return size > INLINE_BYTES


def response_bytes(response: InferenceResponse) -> int:
    """About how many bytes encoding ``response`` touches (BYTES elements count 8 each)."""
    size = 0
    for tensor in response.outputs:
        size += tensor.data.nbytes
    return size


def heavy_response(response: InferenceResponse) -> bool:
    """Whether encoding ``response`` is worth a trip to a worker thread."""
    # Summed in C (asked of every response on the loop): a Python loop costs more here.
    return sum(map(_NBYTES, response.outputs)) > INLINE_BYTES


_NBYTES = operator.attrgetter("data.nbytes")


def set_thread_initializer(initializer: Callable[[], None] | None) -> None:
    """Run ``initializer`` in each worker thread as it starts (thread placement uses it to
    let workers run on every core); call before the first ``run``."""
    global _initializer
    _initializer = initializer


async def run(func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``func(*args, **kwargs)`` on a worker thread; its exceptions are raised here."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_pool(), functools.partial(func, *args, **kwargs))


def _pool() -> ThreadPoolExecutor:
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(
                WORKERS, thread_name_prefix="tritium-codec", initializer=_initializer
            )
            # Start every worker now: a thread started later, from the loop, waits for the
            # GIL while a busy worker holds it.
            for _ in range(WORKERS):
                _executor.submit(_nothing)
        return _executor


def _nothing() -> None:
    pass
