"""Header forwarding: which names a pattern forwards, and which it may never forward."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tritium.cli import parse_config
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.header_forward import HeaderForward, PatternError, header_forward
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
    with pytest.raises(PatternError):
        HeaderForward("(unclosed")


def test_perl_only_syntax_is_refused_as_triton_refuses_it() -> None:
    """RE2 has no lookaround or backreferences; tritonserver refuses such a pattern too."""
    for pattern in ("(?=a)b", r"(a)\1"):
        with pytest.raises(PatternError):
            HeaderForward(pattern)


@pytest.mark.parametrize("pattern", [".*trace.*", ".*-fwd", "(a|aa)*b", "(.*)*x"])
def test_matching_takes_time_linear_in_the_name(pattern: str) -> None:
    """Names a backtracking matcher takes seconds on (60,000 characters, no match) are
    answered in milliseconds."""
    forward = HeaderForward(pattern)
    names = [("a" * 60_000, "v"), ("-" * 30_000 + "fw", "v"), ("a" * 30_000 + "c", "v")]
    started = time.monotonic()
    assert forward.parameters(names) == {}
    assert time.monotonic() - started < 0.5


_WORDS = st.text(alphabet="abXY_-", max_size=6)


@settings(max_examples=200, deadline=None)
@given(pieces=st.lists(st.sampled_from(["a", "b", "X", "_", ".", ".*", "^", "$", "-",
                                         "[ab]", "(a|b)", "?", "+"]), max_size=6),
       names=st.lists(_WORDS, max_size=4))
def test_simple_patterns_forward_what_a_search_ignoring_case_finds(
        pieces: list[str], names: list[str]) -> None:
    """On the syntax RE2 and Python share, a forward pattern matches what ``re.search``
    with IGNORECASE matches: the same names are forwarded."""
    pattern = "".join(pieces)
    try:
        expected = re.compile(pattern, re.IGNORECASE)
    except re.error:
        return
    try:
        forward = HeaderForward(pattern)
    except PatternError:
        return  # e.g. "a**": Python refuses it or not, RE2 decides on its own
    headers = [(name, "v") for name in names if not name.startswith("triton_")]
    found = forward.parameters(headers)
    assert set(found) == {name for name, _ in headers if expected.search(name)}


def test_flags_reach_the_config() -> None:
    config = parse_config(["serve", "--http-header-forward-pattern", "MY_.*",
                           "--grpc-header-forward-pattern", "(?-i)X"])
    assert config.http_header_forward_pattern == "MY_.*"
    assert config.grpc_header_forward_pattern == "(?-i)X"
    with pytest.raises(SystemExit):
        parse_config(["serve", "--grpc-header-forward-pattern", "(unclosed"])
