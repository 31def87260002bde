"""The response cache: keys, the byte bound and LRU eviction, and --cache-config."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests.unit.admitted import admit
from tritium.cli import parse_config
from tritium.core.request import InferenceRequest, RequestedOutput
from tritium.core.response import InferenceResponse
from tritium.core.response_cache import (
    MAX_CACHED_BYTES,
    CacheEntry,
    ModelCache,
    ResponseCache,
    request_key,
)
from tritium.core.statistics import ModelStatistics
from tritium.core.types import DataType, Tensor


def _request(values: list[float], name: str = "INPUT0", shape: tuple[int, ...] | None = None,
             outputs: list[str] | None = None) -> InferenceRequest:
    data = np.array(values, dtype=np.float32)
    shape = shape or (len(values),)
    requested = None if outputs is None else [RequestedOutput(o) for o in outputs]
    return InferenceRequest("m", {name: Tensor(name, DataType.FP32, shape, data.reshape(shape))},
                            requested_outputs=requested)


def _key(request: InferenceRequest, model: str = "m", version: int = 1) -> tuple:
    return request_key(admit(request), model, version)


def test_key_follows_model_version_and_every_part_of_the_inputs() -> None:
    base = _key(_request([1, 2, 3, 4]))
    assert base == _key(_request([1, 2, 3, 4]))
    assert base != _key(_request([1, 2, 3, 5]))
    assert base != _key(_request([1, 2, 3, 4]), version=2)
    assert base != _key(_request([1, 2, 3, 4]), model="other")
    assert base != _key(_request([1, 2, 3, 4], name="INPUT1"))
    assert base != _key(_request([1, 2, 3, 4], shape=(2, 2)))
    assert base != _key(_request([1, 2, 3, 4], outputs=["OUTPUT0"]))


def test_key_of_bytes_inputs() -> None:
    def text(*values: bytes) -> tuple:
        data = np.array(values, dtype=object)
        return _key(InferenceRequest("m", {"T": Tensor("T", DataType.BYTES, data.shape, data)}))

    assert text(b"ab", b"c") == text(b"ab", b"c")
    assert text(b"ab", b"c") != text(b"a", b"bc")


def _entry(size: int) -> CacheEntry:
    return CacheEntry((), (), size)


def test_least_recently_used_entries_are_evicted_to_stay_in_bounds() -> None:
    cache = ResponseCache(100)
    a, b, c = (1, b"a"), (1, b"b"), (1, b"c")
    assert cache.insert(a, _entry(40)) and cache.insert(b, _entry(40))
    assert cache.lookup(a) is not None  # a is now the most recently used
    assert cache.insert(c, _entry(40))
    assert cache.lookup(b) is None
    assert cache.lookup(a) is not None and cache.lookup(c) is not None
    counters = cache.counters
    assert (counters.entries, counters.bytes_used, counters.evictions) == (2, 80, 1)
    assert (counters.lookups, counters.hits, counters.misses) == (4, 3, 1)


def test_an_entry_larger_than_the_cache_is_not_stored() -> None:
    cache = ResponseCache(100)
    assert cache.insert((1, b"small"), _entry(60))
    assert not cache.insert((1, b"big"), _entry(101))
    assert cache.lookup((1, b"small")) is not None  # nothing evicted for it
    assert not cache.insert((1, b"small"), _entry(10))  # already held


def test_an_unloaded_version_leaves_the_cache() -> None:
    cache = ResponseCache(100)
    cache.insert((1, b"a"), _entry(10))
    cache.insert((2, b"a"), _entry(20))
    cache.insert((1, b"b"), _entry(30))
    cache.forget(1)
    assert cache.lookup((1, b"a")) is None and cache.lookup((1, b"b")) is None
    assert cache.lookup((2, b"a")) is not None
    assert (cache.counters.entries, cache.counters.bytes_used) == (1, 20)


def test_a_version_loaded_again_has_keys_of_its_own() -> None:
    request = _request([1, 2])
    assert _key(request) != request_key(admit(request), "m", 1, token=7)


@pytest.mark.parametrize(("flags", "size"), [
    ([], None),
    (["--cache-config", "local,size=1048576"], 1048576),
    (["--cache-config", "local,size=0"], 0),
])
def test_cache_config_flag(flags: list[str], size: int | None) -> None:
    assert parse_config(["serve", *flags]).cache_bytes == size


@pytest.mark.parametrize("spec", ["redis,host=x", "local", "local,size=abc", "local,size=-1",
                                  "local,colour=blue"])
def test_cache_config_refuses_what_it_cannot_honour(spec: str) -> None:
    with pytest.raises(SystemExit):
        parse_config(["serve", "--cache-config", spec])


def _answer(values: np.ndarray) -> InferenceResponse:
    return InferenceResponse(outputs=[Tensor("OUTPUT0", DataType.FP32, values.shape, values)])


def test_a_miss_is_stored_and_answers_the_next_request() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        stats = ModelStatistics()
        cache = ModelCache(ResponseCache(10_000), "m", 1, stats)
        first = admit(_request([1, 2]), loop=loop)
        assert not cache.answer(first)
        output = np.array([3, 4], dtype=np.float32)
        first.stream.send_nowait(_answer(output))
        assert not cache.finished(first)  # the model answered it: stored now
        output[:] = 0  # what the first caller does with its arrays is its own
        second = admit(_request([1, 2]), loop=loop)
        assert cache.answer(second)
        response = await second.stream.receive()
        assert response.final and response.outputs[0].data.tolist() == [3, 4]
        assert cache.finished(second)
        assert (stats.cache_hit.count, stats.cache_miss.count, stats.success.count) == (1, 1, 1)
        assert stats.inference_count == 0  # a hit is no inference

    asyncio.run(scenario())


def test_requests_and_responses_too_big_to_handle_on_the_loop_bypass_the_cache() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        stats = ModelStatistics()
        cache = ModelCache(ResponseCache(1 << 30), "m", 1, stats)
        big = admit(_request([0.0] * (MAX_CACHED_BYTES // 4 + 1)), loop=loop)
        assert not cache.answer(big)
        assert not cache.finished(big)  # never looked up, nothing to store
        for _ in range(2):  # a response too big is not stored: the request misses again
            small = admit(_request([1.0]), loop=loop)
            assert not cache.answer(small)
            small.stream.send_nowait(_answer(np.zeros(MAX_CACHED_BYTES // 4 + 1, np.float32)))
            cache.finished(small)
        assert stats.cache_hit.count == 0 and stats.cache_miss.count == 2

    asyncio.run(scenario())
