"""The core's binary tensor layout and well-known request parameters, without a frontend."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest

from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.parameters import ValueNames, apply_known_parameter, refuse_reserved
from tritium.core.request import SEQUENCE_END, SEQUENCE_START, InferenceRequest
from tritium.core.serialization import (
    array_from_binary,
    bytes_array,
    bytes_from_binary,
    serialize_bytes,
    split_length_prefixed,
    tensor_bytes,
)
from tritium.core.types import DataType, Tensor


def test_bytes_round_trip() -> None:
    data = np.array([[b"ab", "é"], [b"", 7]], dtype=object)
    raw = serialize_bytes(data)
    assert raw[:6] == struct.pack("<I", 2) + b"ab"
    assert split_length_prefixed(raw, 4, "for input 'x'") == [b"ab", "é".encode(), b"", b"7"]


@pytest.mark.parametrize("raw, match", [
    (b"\x01\x00", "incomplete string length indicator for input 'x', expecting 4 bytes"),
    (struct.pack("<I", 5) + b"ab", "incomplete string data for input 'x', expecting 5 bytes"),
    (struct.pack("<I", 0), "expected 2 string elements for input 'x', got 1"),
])
def test_malformed_bytes_name_their_source(raw: bytes, match: str) -> None:
    with pytest.raises(TritiumError, match=match) as info:
        split_length_prefixed(raw, 2, "for input 'x'", "[request id: r] ")
    assert info.value.code is ErrorCode.INVALID_ARG
    assert info.value.message.startswith("[request id: r] ")


def test_array_from_binary_views_fixed_size_values() -> None:
    raw = np.array([1, 2], dtype=np.int16).tobytes()
    array = array_from_binary(raw, DataType.INT16, 2, "for input 'x'")
    assert array.tolist() == [1, 2] and not array.flags.owndata
    strings = array_from_binary(struct.pack("<I", 1) + b"a", DataType.BYTES, 1, "for input 'x'")
    assert strings.dtype == object and strings.tolist() == [b"a"]


def test_bytes_array_keeps_objects() -> None:
    array = bytes_array([b"a", b"bc"])
    assert array.dtype == object and array.tolist() == [b"a", b"bc"]


def test_tensor_bytes_casts_to_the_declared_type_without_copying_when_it_matches() -> None:
    exact = np.arange(3, dtype=np.int32)
    view = tensor_bytes(Tensor("t", DataType.INT32, (3,), exact))
    assert isinstance(view, memoryview) and bytes(view) == exact.tobytes()
    cast = tensor_bytes(Tensor("t", DataType.FP32, (2,), np.array([1.5, 2.5])))
    assert bytes(cast) == np.array([1.5, 2.5], dtype=np.float32).tobytes()
    strings = tensor_bytes(Tensor("t", DataType.BYTES, (1,), bytes_array([b"hi"])))
    assert strings == struct.pack("<I", 2) + b"hi"


def test_uncastable_output_is_internal() -> None:
    tensor = Tensor("t", DataType.INT32, (1,), np.array(["x"], dtype=object))
    with pytest.raises(TritiumError) as info:
        tensor_bytes(tensor)
    assert info.value.code is ErrorCode.INTERNAL


# ------------------------------------------------------------------ request parameters


def test_known_parameters_set_request_fields() -> None:
    request = InferenceRequest(model_name="m", inputs={})
    known = {"sequence_id": "s", "sequence_start": True, "sequence_end": True,
             "priority": 3, "timeout": 100}
    assert all(apply_known_parameter(request, key, value) for key, value in known.items())
    assert request.correlation_id == "s"
    assert request.flags == SEQUENCE_START | SEQUENCE_END
    assert (request.priority, request.timeout_us) == (3, 100)
    assert not apply_known_parameter(request, "custom", 1)


@pytest.mark.parametrize("key, value", [
    ("priority", True), ("priority", -1), ("timeout", 1 << 64), ("sequence_start", 1),
    ("sequence_id", None),
])
def test_known_parameters_check_types(key: str, value: Any) -> None:
    request = InferenceRequest(model_name="m", inputs={})
    names = ValueNames(unsigned="{key} is no uint", boolean="{key} is no flag",
                       string="{key} is no text")
    with pytest.raises(TritiumError, match=f"^{key} is no (uint|flag|text)$"):
        apply_known_parameter(request, key, value, names)


@pytest.mark.parametrize(("key", "value", "text"), [
    ("priority", "high", "Unable to parse 'priority': attempt to access JSON "
     "non-unsigned-integer as unsigned-integer"),
    ("timeout", -1, "Unable to parse 'timeout': attempt to access JSON non-unsigned-integer "
     "as unsigned-integer"),
    ("sequence_start", 1, "Unable to parse 'sequence_start': attempt to access JSON "
     "non-boolean as boolean"),
    ("sequence_id", 1.5, "Unable to parse 'sequence_id': attempt to access JSON non-string as "
     "string"),
])
def test_json_parameter_refusals_read_as_tritons(key: str, value: Any, text: str) -> None:
    """Triton's HTTP frontend names the parameter, then TritonJson's refusal
    (http_server.cc with RETURN_MSG_IF_ERR; triton_json.h); a sequence_id that is no
    unsigned integer is read as a string, so the string's refusal is what it says."""
    with pytest.raises(TritiumError) as caught:
        apply_known_parameter(InferenceRequest(model_name="m", inputs={}), key, value)
    assert caught.value.message == text


def test_reserved_keys() -> None:
    refuse_reserved("headers")
    for key, also in [("triton_x", frozenset[str]()), ("headers", frozenset({"headers"}))]:
        with pytest.raises(TritiumError, match="reserved for Triton usage"):
            refuse_reserved(key, also)


# ------------------------------------------------------------------ BYTES at scale


def test_runs_of_equal_sizes_keep_every_byte() -> None:
    elements = [b"\x00ab\x00"] * 5000 + [b""] * 7000 + [b"x"] + [b"12345678"] * 3000
    raw = serialize_bytes(np.array(elements, dtype=object))
    assert bytes_from_binary(raw, len(elements), "x").tolist() == elements
    assert bytes_from_binary(memoryview(raw), len(elements), "x").tolist() == elements


def test_mixed_sizes_split_as_one_by_one() -> None:
    elements = [b"x" * (i % 3) for i in range(10_000)]
    raw = serialize_bytes(np.array(elements, dtype=object))
    assert split_length_prefixed(raw, len(elements), "x") == elements
    with pytest.raises(TritiumError, match="expected 10001 string elements for input 'x', "
                                           "got 10000"):
        bytes_from_binary(raw, 10_001, "for input 'x'")


def test_a_count_the_data_cannot_hold_is_refused_without_allocating() -> None:
    with pytest.raises(TritiumError, match="expected 1099511627776 string elements x, got 2"):
        bytes_from_binary(struct.pack("<II", 0, 0), 2**40, "x")


def test_a_flood_of_empty_elements_is_split_at_vector_speed() -> None:
    count = 4_000_000
    array = bytes_from_binary(bytes(4 * count), count, "x")
    assert array.shape == (count,) and array[0] == b"" and array[-1] == b""
