"""Pure pieces of instance-process supervision: the restart schedule, exit descriptions,
``EXECUTION_ENV_PATH`` resolution, and what a child process is (argv, sys.path, forks)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2

from tritium.core.errors import TritiumError
from tritium.execution.process import environment
from tritium.execution.process.restart import Backoff, RestartPolicy, describe_exit


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- restart schedule --------------------------------------------------------------------
def test_backoff_doubles_while_the_instance_keeps_dying_and_stops_at_the_cap() -> None:
    clock = FakeClock()
    backoff = Backoff(RestartPolicy(first_delay_s=0.1, factor=2, max_delay_s=1.0,
                                    stable_after_s=60), clock)
    delays = []
    for _ in range(6):
        backoff.started()
        clock.now += 1  # up for a second, then dead again
        delays.append(backoff.died())
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    assert backoff.deaths_in_a_row == 6


def test_backoff_starts_over_after_a_stable_run() -> None:
    clock = FakeClock()
    backoff = Backoff(RestartPolicy(first_delay_s=0.5, factor=3, max_delay_s=100,
                                    stable_after_s=10), clock)
    backoff.started()
    assert backoff.died() == 0.5
    backoff.started()
    assert backoff.died() == 1.5
    backoff.started()
    clock.now += 10  # stayed up long enough: the next death is a first one again
    assert backoff.died() == 0.5


def test_a_failed_start_counts_as_a_death_in_a_row() -> None:
    """An instance whose initialize() fails on restart never calls started(): no reset."""
    clock = FakeClock()
    backoff = Backoff(RestartPolicy(first_delay_s=1, factor=2, max_delay_s=100,
                                    stable_after_s=1), clock)
    backoff.started()
    clock.now += 50
    assert backoff.died() == 1
    clock.now += 50  # time passes while restarting, but it never came up
    assert backoff.died() == 2


@pytest.mark.parametrize(("code", "text"), [
    (-signal.SIGSEGV, "killed by signal SIGSEGV (11)"),
    (-signal.SIGKILL, "killed by signal SIGKILL (9)"),
    (3, "exited with code 3"),
    (0, "exited with code 0"),
    (-200, "killed by signal unknown signal (200)"),
    (None, "still running"),
])
def test_exit_descriptions_name_the_signal_or_code(code: int | None, text: str) -> None:
    assert describe_exit(code) == text


# -- EXECUTION_ENV_PATH ------------------------------------------------------------------
def _config(value: str | None, name: str = "m") -> model_config_pb2.ModelConfig:
    config = model_config_pb2.ModelConfig(name=name)
    if value is not None:
        config.parameters[environment.PARAMETER].string_value = value
    return config


def test_no_parameter_means_no_environment(tmp_path: Path) -> None:
    assert environment.configured_path(_config(None), str(tmp_path)) is None
    assert environment.resolve(_config(None), str(tmp_path)) is None


def test_the_model_directory_keyword_is_expanded_once_as_triton_does() -> None:
    """python_be.cc replaces the first "$$TRITON_MODEL_DIRECTORY" with the model's
    repository path; later occurrences stay as written."""
    value = "$$TRITON_MODEL_DIRECTORY/env.tar.gz"
    assert environment.expand_model_directory(value, "/models/m") == "/models/m/env.tar.gz"
    twice = "$$TRITON_MODEL_DIRECTORY/$$TRITON_MODEL_DIRECTORY"
    assert environment.expand_model_directory(twice, "/x") == "/x/$$TRITON_MODEL_DIRECTORY"
    assert environment.configured_path(_config(value), "/models/m") == "/models/m/env.tar.gz"


def test_a_missing_path_is_refused_in_tritons_words(tmp_path: Path) -> None:
    """pb_env.cc: "Failed to get the canonical path for <path>." when realpath fails."""
    missing = tmp_path / "nowhere"
    with pytest.raises(TritiumError) as caught:
        environment.resolve(_config(str(missing)), str(tmp_path))
    assert caught.value.message == f"Failed to get the canonical path for {missing}."


def test_a_directory_without_an_interpreter_is_refused(tmp_path: Path) -> None:
    (tmp_path / "env" / "lib").mkdir(parents=True)
    with pytest.raises(TritiumError) as caught:
        environment.resolve(_config("$$TRITON_MODEL_DIRECTORY/env", "nopy"), str(tmp_path))
    text = caught.value.message
    assert "model 'nopy'" in text and "no Python interpreter" in text and "bin/python" in text


def test_a_file_that_is_no_archive_is_refused(tmp_path: Path) -> None:
    (tmp_path / "env.tar.gz").write_bytes(b"not a tar archive at all" * 40)
    with pytest.raises(TritiumError, match="neither a directory nor a tar archive"):
        environment.resolve(_config(str(tmp_path / "env.tar.gz")), str(tmp_path))


def _fake_python(root: Path, script: str) -> Path:
    """An 'interpreter' that is a shell script: enough to test the lookup and the probe."""
    (root / "bin").mkdir(parents=True, exist_ok=True)
    python = root / "bin" / "python"
    python.write_text(f"#!/bin/sh\n{script}\n")
    python.chmod(0o755)
    return python


def test_an_interpreter_without_numpy_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    facts = {"python": "3.11", "numpy_error": "ModuleNotFoundError: No module named 'numpy'"}
    _fake_python(tmp_path / "env", f"cat <<'EOF'\n{json.dumps(facts)}\nEOF")
    with pytest.raises(TritiumError) as caught:
        environment.resolve(_config(str(tmp_path / "env")), str(tmp_path))
    assert "cannot import numpy" in caught.value.message
    assert "No module named 'numpy'" in caught.value.message
    assert "must contain numpy" in caught.value.message


def _tar_of(directory: Path, archive: Path, wrap: str = "") -> None:
    with tarfile.open(archive, "w:gz") as tar:
        for entry in sorted(directory.rglob("*")):
            tar.add(entry, arcname=os.path.join(wrap, str(entry.relative_to(directory))),
                    recursive=False)


def test_an_archive_is_extracted_once_into_a_private_cache_named_by_content(
        tmp_path: Path) -> None:
    source = tmp_path / "src"
    _fake_python(source, 'echo \'{"python": "3.11", "numpy": "9.9"}\'')
    archive = tmp_path / "model" / "env.tar.gz"
    archive.parent.mkdir()
    _tar_of(source, archive)
    cache = tmp_path / "cache"
    first = environment.resolve(_config("$$TRITON_MODEL_DIRECTORY/env.tar.gz"),
                                str(archive.parent), cache)
    assert first is not None
    assert first.root.parent == cache and first.interpreter == first.root / "bin" / "python"
    assert first.numpy == "9.9"
    assert (cache.stat().st_mode & 0o777) == 0o700
    marker = first.root / "marker"
    marker.write_text("kept")
    again = environment.resolve(_config(str(archive)), str(tmp_path), cache)
    assert again is not None and again.root == first.root and marker.exists()
    assert [p.name for p in cache.iterdir()] == [first.root.name]  # no staging left over


def test_an_archive_that_wraps_the_environment_in_one_directory_is_found(
        tmp_path: Path) -> None:
    source = tmp_path / "src"
    _fake_python(source, 'echo \'{"python": "3.11", "numpy": "1.0"}\'')
    archive = tmp_path / "wrapped.tar.gz"
    _tar_of(source, archive, wrap="myenv")
    resolved = environment.resolve(_config(str(archive)), str(tmp_path), tmp_path / "cache")
    assert resolved is not None and resolved.interpreter.parent.parent.name == "myenv"


def test_an_archive_member_outside_the_target_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "evil.tar"
    with tarfile.open(archive, "w") as tar:
        data = b"owned"
        member = tarfile.TarInfo("../escaped")
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
    with pytest.raises(TritiumError, match="cannot extract"):
        environment.resolve(_config(str(archive)), str(tmp_path), tmp_path / "cache")
    assert not (tmp_path / "escaped").exists()


def test_a_cache_others_can_write_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "src"
    _fake_python(source, "true")
    archive = tmp_path / "env.tar"
    _tar_of(source, archive)
    cache = tmp_path / "shared"
    cache.mkdir(mode=0o777)
    cache.chmod(0o777)
    with pytest.raises(TritiumError, match="writable by others"):
        environment.resolve(_config(str(archive)), str(tmp_path), cache)


def test_the_spawn_environment_activates_the_environment(tmp_path: Path) -> None:
    env = environment.ExecutionEnvironment("x", tmp_path, tmp_path / "bin" / "python",
                                           "3.11", "2.0")
    spawned = env.spawn_env({"PATH": "/usr/bin", "PYTHONPATH": "/elsewhere", "HOME": "/h"})
    assert spawned["PATH"] == f"{tmp_path}/bin:/usr/bin"
    assert spawned["VIRTUAL_ENV"] == str(tmp_path)
    assert spawned["LD_LIBRARY_PATH"] == f"{tmp_path}/lib"
    assert "PYTHONPATH" not in spawned and spawned["HOME"] == "/h"
    # The server's PYTHONPATH still reaches the child, after the environment's own paths.
    assert "/elsewhere" in spawned[environment.SERVER_PATH_ENV].split(os.pathsep)
    command = env.command("some.module", ["a", "b"])
    assert command[:2] == [str(tmp_path / "bin" / "python"), "-c"]
    assert command[3:] == ["some.module", "a", "b"]


def test_the_bootstrap_runs_the_module_like_python_dash_m(tmp_path: Path) -> None:
    (tmp_path / "probe_mod.py").write_text(textwrap.dedent("""
        import json, sys
        print(json.dumps({"name": __name__, "argv": sys.argv[1:]}))
    """))
    env = environment.ExecutionEnvironment("x", tmp_path, Path(sys.executable), "", "")
    spawned = env.spawn_env(dict(os.environ))
    spawned[environment.SERVER_PATH_ENV] += os.pathsep + str(tmp_path)
    done = subprocess.run(env.command("probe_mod", ["one", "two"]), env=spawned,
                          capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(done.stdout) == {"name": "__main__", "argv": ["one", "two"]}
