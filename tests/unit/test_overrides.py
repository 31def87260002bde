"""Load overrides: every ``file:`` path and content checked before a byte is written, then
written into a private directory that is removed without a trace."""

from __future__ import annotations

import base64
import stat
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tritium.core.errors import ErrorCode, TritiumError
from tritium.repository.overrides import (
    DIR_PREFIX,
    OverrideDir,
    OverrideLimits,
    override_path,
    parse_overrides,
)


def refused(parameters: dict[str, Any], limits: OverrideLimits | None = None) -> str:
    with pytest.raises(TritiumError) as caught:
        if limits is None:
            parse_overrides("m", parameters)
        else:
            parse_overrides("m", parameters, limits)
    assert caught.value.code is ErrorCode.INVALID_ARG
    return caught.value.message


def test_base64_text_and_raw_bytes_decode_to_normalized_paths() -> None:
    overrides = parse_overrides("m", {
        "config": "{}", "file:1/model.py": base64.b64encode(b"code").decode(),
        "file:1//data/./x.bin": b"\x00\x01", "unload_dependents": True})
    assert overrides.files == {"1/model.py": b"code", "1/data/x.bin": b"\x00\x01"}
    assert overrides.config is not None


@pytest.mark.parametrize("path, problem", [
    ("../evil.py", "within the model directory"),
    ("1/../../evil.py", "within the model directory"),
    ("/../evil.py", "within the model directory"),
    ("/", "names no file"),
    ("1\\..\\evil.py", "backslash"),
    ("1/model\x00.py", "control character"),
    ("1/a\nb", "control character"),
    ("", "names no file"),
    (".", "names no file"),
    ("/".join(["d"] * 40) + "/model.py", "levels deep"),
    ("/".join(["d"] * 2000) + "/model.py", "bytes long"),
    ("x" * 2000, "bytes long"),
    ("1/" + "y" * 256, "component"),
])
def test_paths_outside_a_plain_relative_layout_are_refused(path: str, problem: str) -> None:
    message = refused({"config": "{}", f"file:{path}": b"x"})
    assert "invalid file override path" in message
    assert problem in message
    assert "\x00" not in message and len(message) < 400


@pytest.mark.parametrize("path, inside", [
    ("/1/model.py", "1/model.py"),
    ("//1/model.py", "1/model.py"),
    ("/tmp/evil.py", "tmp/evil.py"),
])
def test_a_leading_slash_names_a_path_inside_the_model_directory(path: str,
                                                                  inside: str) -> None:
    """Triton's load handler joins the text after ``file:`` onto the model directory (its
    path join drops or doubles the separator, canonicalization collapses it) and only then
    checks the result stays inside: a leading slash is not an absolute path there."""
    assert override_path("m", f"file:{path}") == inside


def test_two_keys_for_one_file_are_refused() -> None:
    message = refused({"config": "{}", "file:1/model.py": b"a", "file:1/./model.py": b"b"})
    assert "name the same file" in message


def test_a_file_where_a_directory_is_needed_is_refused() -> None:
    message = refused({"config": "{}", "file:1": b"a", "file:1/model.py": b"b"})
    assert "directory has been created as a file" in message


def test_files_need_a_config() -> None:
    assert "'config' must be specified" in refused({"file:1/model.py": b"x"})


@pytest.mark.parametrize("value, problem", [
    ("not base64!", "not valid base64"),
    (12, "must hold the file's bytes"),
    (None, "must hold the file's bytes"),
])
def test_content_must_decode(value: Any, problem: str) -> None:
    assert problem in refused({"config": "{}", "file:1/model.py": value})


def test_count_and_total_size_are_bounded_before_decoding() -> None:
    limits = OverrideLimits(max_files=3, max_total_bytes=1000)
    many = {f"file:1/f{i}.py": b"" for i in range(4)}
    assert "more than the 3" in refused({"config": "{}", **many}, limits)
    # Not valid base64 either: the size is refused before anything is decoded.
    big = "!" * 2000
    assert "more than the 1000" in refused({"config": "{}", "file:1/model.py": big}, limits)


def test_bad_config_override_is_refused() -> None:
    assert "Invalid config override" in refused({"config": "[1]"})
    assert "JSON string" in refused({"config": 5})


@pytest.mark.parametrize("parameters", [[1, 2], "config", 7])
def test_parameters_that_are_not_an_object_are_refused(parameters: Any) -> None:
    assert "must be an object" in refused(parameters)


def test_override_path_normalizes() -> None:
    assert override_path("m", "file:1/./sub//model.py") == "1/sub/model.py"


def test_a_slashed_and_a_plain_key_for_one_file_are_refused() -> None:
    message = refused({"config": "{}", "file:1/model.py": b"a", "file:/1/model.py": b"b"})
    assert "name the same file" in message


def test_written_directory_is_private_and_removed(tmp_path: Path) -> None:
    holder = OverrideDir.write("m", {"1/model.py": b"code", "1/pkg/x.py": b"x"})
    try:
        assert holder.model_dir == holder.root / "m"
        assert holder.root.name.startswith(DIR_PREFIX)
        assert stat.S_IMODE(holder.root.stat().st_mode) == 0o700
        assert stat.S_IMODE(holder.model_dir.stat().st_mode) == 0o700
        written = holder.model_dir / "1" / "model.py"
        assert written.read_bytes() == b"code"
        assert stat.S_IMODE(written.stat().st_mode) == 0o600
        assert (holder.model_dir / "1" / "pkg" / "x.py").read_bytes() == b"x"
    finally:
        holder.remove()
    assert not holder.root.exists()
    holder.remove()  # twice is fine


def test_a_name_that_is_not_one_component_writes_nothing() -> None:
    before = set(Path(tempfile.gettempdir()).glob(f"{DIR_PREFIX}*"))
    with pytest.raises(TritiumError) as caught:
        OverrideDir.write("../escape", {"1/model.py": b"code"})
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert set(Path(tempfile.gettempdir()).glob(f"{DIR_PREFIX}*")) == before


def test_a_failed_write_leaves_nothing_behind() -> None:
    before = set(Path(tempfile.gettempdir()).glob(f"{DIR_PREFIX}*"))
    # Unchecked layout (parse_overrides refuses it): the second file cannot be created.
    with pytest.raises(OSError):
        OverrideDir.write("m", {"1": b"a", "1/model.py": b"b"})
    assert set(Path(tempfile.gettempdir()).glob(f"{DIR_PREFIX}*")) == before
