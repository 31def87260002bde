"""Model names: one path component, and what Triton's python backend accepts."""

from __future__ import annotations

import pytest

from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.names import (
    MAX_NAME_BYTES,
    STUB_INVALID_CHARS,
    check_model_name,
    model_name_problem,
    shown,
)


@pytest.mark.parametrize("name", [
    "add_sub", "identity-fp32", "a.b", "a..b", "v1.2", "model name", "modèle", "名前",
    "a@b", "a+b=c", "50%", "%2F", "a:b", "x" * MAX_NAME_BYTES, "é" * (MAX_NAME_BYTES // 2),
])
def test_names_triton_accepts_are_accepted(name: str) -> None:
    assert check_model_name(name) == name
    assert model_name_problem(name) == ""


@pytest.mark.parametrize("name, problem", [
    ("/tmp/x", "path traversal"),
    ("../../x", "path traversal"),
    ("a/b", "path traversal"),
    ("a\\b", "path traversal"),
    ("..", "path traversal"),
    (".", "path traversal"),
    (".hidden", "must not start with '.'"),
    ("a\x00b", "control characters"),
    ("a\nb", "control characters"),
    ("a\x7f", "control characters"),
    ("", "cannot be empty"),
    ("   ", "cannot be empty"),
    ("x" * (MAX_NAME_BYTES + 1), f"at most {MAX_NAME_BYTES} bytes"),
    ("é" * (MAX_NAME_BYTES // 2 + 1), f"at most {MAX_NAME_BYTES} bytes"),
])
def test_names_that_are_not_one_path_component_are_refused(name: str, problem: str) -> None:
    with pytest.raises(TritiumError) as caught:
        check_model_name(name)
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert problem in caught.value.message


@pytest.mark.parametrize("char", sorted(set(STUB_INVALID_CHARS) - {"\\"}))
def test_characters_the_python_backend_refuses_are_refused(char: str) -> None:
    problem = model_name_problem(f"a{char}b")
    assert "must not contain any of" in problem
    # The python backend's own words, which Triton's tests match.
    assert "Invalid stub name: contains invalid characters" in problem


def test_a_backslash_is_traversal_and_a_stub_character() -> None:
    problem = model_name_problem("model\\test")
    assert "path traversal" in problem
    assert "Invalid stub name: contains invalid characters" in problem


def test_the_python_backend_list_is_triton_s() -> None:
    assert set(STUB_INVALID_CHARS) == set(";|&$`<>()[]{}\\\"'*?~#!")


def test_messages_show_names_safely() -> None:
    assert shown("a\x00b\nc") == "a\\x00b\\nc"
    long = shown("y" * 10_000)
    assert long.endswith("...") and len(long) < 100
    problem = model_name_problem("a\x00" + "z" * 10_000)
    assert "\x00" not in problem and len(problem) < 200
