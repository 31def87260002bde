"""Triton's local response cache: answers a repeated request without running its model.

One cache per server (``--cache-config local,size=N``), bounded in bytes, least recently
used entries evicted first. An entry is keyed by the model, its version and the request's
inputs (each one's name, data type, shape and bytes, in name order) and the outputs it
asked for. Triton's key holds the inputs' names and bytes only; the data type, shape and
requested outputs are added here so that a hit never answers with tensors of another
shape or outputs the request did not ask for.

A model version uses the cache through its ``ModelCache`` (``response_cache { enable:
true }`` in its config): ``answer`` on arrival, ``finished`` when its final response was
sent. Everything runs on the event loop.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from tritium.core.request import AdmittedRequest, RequestStage
from tritium.core.response import InferenceResponse
from tritium.core.serialization import tensor_bytes
from tritium.core.statistics import ModelStatistics
from tritium.core.types import DataType, Tensor

log = logging.getLogger("tritium.repository")

# (the loaded version's token, the digest of the request): a version loaded again gets a
# new token, so what its previous load answered is never served for it.
CacheKey = tuple[int, bytes]
_tokens = itertools.count(1)
# Hashing a request and copying a response happen on the event loop: a request whose
# inputs, or a response whose outputs, hold more than this bypasses the cache rather than
# hold the loop for tens of milliseconds.
MAX_CACHED_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class CacheEntry:
    outputs: tuple[Tensor, ...]
    parameters: tuple[tuple[str, object], ...]
    size: int  # bytes charged against the cache's bound


@dataclass(slots=True)
class CacheCounters:
    """Server-wide figures of the cache."""

    entries: int = 0
    bytes_used: int = 0
    lookups: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0


class ResponseCache:
    """A byte-bounded LRU map from request keys to responses' outputs."""

    def __init__(self, capacity_bytes: int):
        self.capacity = capacity_bytes
        self.counters = CacheCounters()
        self._entries: collections.OrderedDict[CacheKey, CacheEntry] = collections.OrderedDict()

    def lookup(self, key: CacheKey) -> CacheEntry | None:
        counters = self.counters
        counters.lookups += 1
        entry = self._entries.get(key)
        if entry is None:
            counters.misses += 1
            return None
        counters.hits += 1
        self._entries.move_to_end(key)
        return entry

    def insert(self, key: CacheKey, entry: CacheEntry) -> bool:
        """Store ``entry``, evicting the least recently used ones to make room; False when
        it cannot fit at all (larger than the whole cache) or the key is already held."""
        if entry.size > self.capacity or key in self._entries:
            return False
        counters = self.counters
        while counters.bytes_used + entry.size > self.capacity:
            _, evicted = self._entries.popitem(last=False)
            counters.bytes_used -= evicted.size
            counters.entries -= 1
            counters.evictions += 1
        self._entries[key] = entry
        counters.bytes_used += entry.size
        counters.entries += 1
        return True

    def forget(self, token: int) -> None:
        """Drop every entry of the loaded version ``token`` (it was unloaded)."""
        for key in [key for key in self._entries if key[0] == token]:
            entry = self._entries.pop(key)
            self.counters.bytes_used -= entry.size
            self.counters.entries -= 1


def request_key(request: AdmittedRequest, model_name: str, version: int, token: int = 0
                ) -> CacheKey:
    """The cache key of ``request`` for ``model_name`` version ``version`` (loaded as
    ``token``)."""
    digest = hashlib.blake2b(digest_size=20)
    digest.update(f"{model_name}\0{version}\0".encode())
    inner = request.request
    for name in sorted(inner.inputs):
        tensor = inner.inputs[name]
        digest.update(f"{name}\0{tensor.datatype.wire}\0{tensor.shape}\0".encode())
        data = tensor_bytes(tensor)
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    names = inner.requested_output_names()
    digest.update(b"*" if names is None else "\0".join(sorted(names)).encode())
    return (token, digest.digest())


def _entry(response: InferenceResponse, size: int) -> CacheEntry:
    # Copies: what the first client (or a BLS caller) does with its arrays cannot reach
    # the cache.
    outputs = tuple(Tensor(t.name, t.datatype, t.shape, np.array(t.data, copy=True))
                    for t in response.outputs)
    return CacheEntry(outputs, tuple(response.parameters.items()), size)


# Beyond this many BYTES elements, a tensor is not sized element by element (a Python
# loop on the event loop) and counts as too big to cache.
_MAX_STRING_ELEMENTS = 65536


def _byte_size(tensor: Tensor) -> int:
    """The tensor's serialized size; more than MAX_CACHED_BYTES when it is not worth
    counting exactly."""
    if tensor.datatype is not DataType.BYTES:
        return int(tensor.data.nbytes)
    if tensor.data.size > _MAX_STRING_ELEMENTS:
        return MAX_CACHED_BYTES + 1
    return sum(4 + len(element) for element in tensor.data.reshape(-1).tolist())


def _cacheable(request: AdmittedRequest) -> bool:
    """Whether the request's inputs are small enough to hash on the loop."""
    total = 0
    for tensor in request.request.inputs.values():
        total += _byte_size(tensor)
        if total > MAX_CACHED_BYTES:
            return False
    return True


def _response(entry: CacheEntry) -> InferenceResponse:
    # Copies again, as Triton copies a hit into fresh response buffers.
    outputs = [Tensor(t.name, t.datatype, t.shape, t.data.copy()) for t in entry.outputs]
    return InferenceResponse(outputs=outputs, parameters=dict(entry.parameters))


class ModelCache:
    """One model version's use of the server's cache, and its cache statistics."""

    def __init__(self, cache: ResponseCache, model_name: str, version: int,
                 stats: ModelStatistics):
        self._cache = cache
        self._name = model_name
        self._version = version
        self._stats = stats
        self._token = next(_tokens)
        # Requests answered from the cache, and missed ones with their key and lookup
        # time, until they finish.
        self._hits: set[AdmittedRequest] = set()
        self._misses: dict[AdmittedRequest, tuple[CacheKey, int]] = {}

    def answer(self, request: AdmittedRequest) -> bool:
        """Answer ``request`` from the cache if it holds its response (True), or remember
        its key so that its response is stored when it succeeds (False)."""
        if not _cacheable(request):
            return False
        started = time.monotonic_ns()
        key = request_key(request, self._name, self._version, self._token)
        entry = self._cache.lookup(key)
        elapsed = time.monotonic_ns() - started
        if entry is None:
            self._misses[request] = (key, elapsed)
            return False
        stats = self._stats
        stats.cache_hit.add(elapsed)
        stats.queue.add(started - request.arrival_ns)
        self._hits.add(request)
        request.move_to(RequestStage.QUEUED)
        # Sent on the next step of the loop: the service has not yet hooked up what the
        # stream's end calls when ``enqueue`` returns.
        loop = request.cancellation.loop
        loop.call_soon(request.stream.send_nowait, _response(entry))
        return True

    def finished(self, request: AdmittedRequest) -> bool:
        """Count a request's end; True for one answered from the cache (which the model's
        scheduler never saw). A missed request that succeeded has its response stored."""
        if request in self._hits:
            self._hits.discard(request)
            self._count_hit(request)
            return True
        missed = self._misses.pop(request, None)
        if missed is not None:
            self._store(request, *missed)
        return False

    def forget(self, request: AdmittedRequest) -> None:
        """``request`` was refused before it was queued: nothing is stored for it."""
        self._misses.pop(request, None)

    def close(self) -> None:
        """The version is unloaded: its entries leave the cache."""
        self._cache.forget(self._token)

    def _count_hit(self, request: AdmittedRequest) -> None:
        if request.stage is not RequestStage.DONE:
            request.move_to(RequestStage.DONE)
        stats = self._stats
        elapsed = time.monotonic_ns() - request.arrival_ns
        if request.cancellation.reason is not None:
            stats.failures["CANCELED"] += 1
            stats.fail.add(elapsed)
            return
        stats.success.add(elapsed)
        stats.last_inference_ms = time.time_ns() // 1_000_000

    def _store(self, request: AdmittedRequest, key: CacheKey, lookup_ns: int) -> None:
        response = request.stream.final_response
        if (request.cancellation.reason is not None or request.stream.error is not None
                or response is None or response.flag_only or response.error is not None):
            return
        started = time.monotonic_ns()
        size = len(key[1]) + sum(_byte_size(t) for t in response.outputs)
        if size <= min(self._cache.capacity, MAX_CACHED_BYTES):
            self._cache.insert(key, _entry(response, size))
        self._stats.cache_miss.add(lookup_ns + time.monotonic_ns() - started)


def cache_for(config: Any, cache: ResponseCache | None, version: int,
              stats: ModelStatistics) -> ModelCache | None:
    """The version's use of the server's response cache: only when its config enables it
    and the server has one (``--cache-config``)."""
    if not config.response_cache.enable:
        return None
    if cache is None:
        log.warning("model '%s' enables the response cache, but the server has none "
                    "(--cache-config): its responses are not cached", config.name)
        return None
    return ModelCache(cache, config.name, version, stats)
