"""Header forwarding: which names a pattern forwards, and which it may never forward."""

from __future__ import annotations

import re

import pytest

from tritium.cli import parse_config
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.header_forward import HeaderForward, header_forward
from tritium.core.request import InferenceRequest


def test_a_pattern_matches_anywhere_in_the_name_ignoring_case() -> None:
    """Triton prepends "(?i)" to the flag's pattern and uses RE2's PartialMatch."""
    forward = HeaderForward("MY_HEADER.*")
    found = forward.parameters([("my_header_1", "a"), ("x-my_header", "b"),
                                ("MY_HEADER_2", "c"), ("other", "d")])
    assert found == {"my_header_1": "a", "x-my_header": "b", "MY_HEADER_2": "c"}


def test_a_leading_case_sensitive_flag_is_honoured() -> None:
    """Triton's docs: "(?-i)" at the start of the pattern turns case-insensitivity off."""
    forward = HeaderForward("(?-i)MY_HEADER.*")
    assert forward.parameters([("my_header_1", "a"), ("MY_HEADER_2", "b")]) == {
        "MY_HEADER_2": "b"}


@pytest.mark.parametrize("name", ["sequence_id", "sequence_start", "sequence_end",
                                  "priority", "timeout", "headers", "binary_data_output",
                                  "triton_enable_empty_final_response", "triton_anything"])
def test_a_reserved_name_that_matches_is_refused(name: str) -> None:
    """Triton refuses a matching header that is a reserved parameter key or starts with
    "triton_": "Header '<name>' is reserved for Triton usage and cannot be forwarded."."""
    with pytest.raises(TritiumError) as caught:
        HeaderForward(".*").parameters([("fine", "1"), (name, "x")])
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert caught.value.message == (f"Header '{name}' is reserved for Triton usage and "
                                    "cannot be forwarded.")


def test_a_reserved_name_that_does_not_match_is_left_alone() -> None:
    assert HeaderForward("^my_").parameters([("timeout", "1"), ("my_x", "2")]) == {
        "my_x": "2"}


def test_a_header_wins_over_a_body_parameter_of_its_name() -> None:
    request = InferenceRequest(model_name="m", inputs={}, parameters={"my_a": 1, "b": 2})
    HeaderForward("^my_").apply(request, {"my_a": "from header", "c": "3"})
    assert request.parameters == {"my_a": "from header", "b": 2}


def test_no_pattern_forwards_nothing() -> None:
    assert header_forward("") is None
    assert header_forward(None) is None
    with pytest.raises(re.error):
        HeaderForward("(unclosed")


def test_flags_reach_the_config() -> None:
    config = parse_config(["serve", "--http-header-forward-pattern", "MY_.*",
                           "--grpc-header-forward-pattern", "(?-i)X"])
    assert config.http_header_forward_pattern == "MY_.*"
    assert config.grpc_header_forward_pattern == "(?-i)X"
    with pytest.raises(SystemExit):
        parse_config(["serve", "--grpc-header-forward-pattern", "(unclosed"])
