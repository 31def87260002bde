"""A stream's bytes to gRPC messages: however the bytes are cut, the same messages come out,
and a big one is gathered in a buffer of its own."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tritium.frontends.grpc.messages import MessageReader, MessageTooLarge

MiB = 1 << 20


def prefixed(body: bytes, compressed: bool = False) -> bytes:
    return bytes((int(compressed),)) + len(body).to_bytes(4, "big") + body


BIG = bytes(range(256)) * (3 * MiB // 256)
STREAM = prefixed(b"small") + prefixed(BIG, compressed=True) + prefixed(b"") + prefixed(b"x" * 70)


def read(cuts: list[int]) -> tuple[list[tuple[bytes, bool]], MessageReader]:
    reader = MessageReader(8 * MiB)
    found, start = [], 0
    for end in [*sorted(set(cuts)), len(STREAM)]:
        found += reader.feed(memoryview(STREAM)[start:end])
        start = end
    return [(bytes(m.body), m.compressed) for m in found], reader


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, len(STREAM)), max_size=12))
def test_any_cuts_give_the_same_messages(cuts: list[int]) -> None:
    messages, reader = read(cuts)
    assert messages == [(b"small", False), (BIG, True), (b"", False), (b"x" * 70, False)]
    assert reader.partial == 0 and reader.whole is None


def test_a_big_message_is_gathered_in_a_buffer_of_its_own() -> None:
    reader = MessageReader(8 * MiB)
    head = prefixed(BIG)
    assert reader.feed(memoryview(head)[:100]) == []
    assert isinstance(reader.whole, np.ndarray) and reader.whole.size == len(head)
    assert reader.partial == 100 and not reader.buf
    assert reader.feed(memoryview(head)[100:MiB]) == [] and reader.partial == MiB
    [message] = reader.feed(memoryview(head)[MiB:])
    assert message.body == BIG and isinstance(message.body, memoryview)
    reader.feed(memoryview(head)[:MiB])
    reader.clear()
    assert reader.partial == 0 and reader.whole is None


def test_a_big_message_over_the_limit_is_refused_before_anything_is_gathered() -> None:
    reader = MessageReader(MiB)
    with pytest.raises(MessageTooLarge):
        reader.feed(memoryview(prefixed(BIG))[:10])
    assert reader.whole is None


def _status_mib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1]) // 1024
    raise AssertionError(f"no {field}")


def test_an_inflated_message_is_held_about_once_even_after_malloc_kept_big_blocks() -> None:
    """Once a process has freed a block as large as an inflation step, malloc serves such
    blocks from its heap and keeps them: the pieces must not stay held while joined."""
    import asyncio
    import zlib

    from tritium.frontends.grpc.messages import inflate

    size = 256 << 20
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    bomb = packer.compress(bytes(size)) + packer.flush()
    block = bytearray(5 << 20)  # freed: malloc's threshold for mapping blocks rises past it
    del block
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # the peak (VmHWM) starts again from what is held now
    except OSError:
        pytest.skip("this kernel cannot reset a process's peak memory")
    before = _status_mib("VmRSS")
    message = asyncio.run(inflate(bomb, "gzip", size + 1))
    assert len(message) == size
    grown = _status_mib("VmHWM") - before
    assert grown < 1.25 * (size >> 20), f"peak grew {grown} MiB for a {size >> 20} MiB message"
