"""EXECUTION_ENV_PATH: a process-kind instance runs the Python of its model's environment
(a venv directory, or a tarball of one), with that environment's packages first; and a
model process sees what Triton's stub gives it (argv, the model's directories on sys.path)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.server_process import TritiumProcess
from tests.zoo import _parameter, _tensor, add_model

pytestmark = pytest.mark.e2e

PACKAGE = "iniconfig"  # small, pure, and the server has its own (another) version
ENV_VERSION = "2.3.0"
IO = _tensor("input", "INPUT0", "FP32", "1") + _tensor("output", "OUTPUT0", "BYTES", "1")
PROCESS = _parameter("TRITIUM_INSTANCE_KIND", "process")


def _venv(root: Path, system_site_packages: bool) -> Path:
    base = getattr(sys, "_base_executable", sys.executable)
    args = [base, "-m", "venv", "--without-pip", str(root)]
    if system_site_packages:
        args.insert(3, "--system-site-packages")
    subprocess.run(args, check=True, timeout=120)
    return root / "bin" / "python"


def _pip_install(python: Path, *requirements: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                    "--quiet", "--no-deps", "--ignore-installed", *requirements],
                   check=True, timeout=300)


@pytest.fixture(scope="session")
def other_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv (made once per test session) whose own site-packages hold iniconfig 2.3.0;
    numpy comes from the base Python, or is installed into it when that has none."""
    root = tmp_path_factory.mktemp("envs") / "other"
    python = _venv(root, system_site_packages=True)
    if subprocess.run([str(python), "-c", "import numpy"], check=False).returncode != 0:
        _pip_install(python, "numpy")
    _pip_install(python, f"{PACKAGE}=={ENV_VERSION}")
    return root


@pytest.fixture(scope="session")
def bare_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with nothing in it: no numpy."""
    root = tmp_path_factory.mktemp("envs") / "bare"
    _venv(root, system_site_packages=False)
    return root


def _probe_model(repo: Path, name: str, env_path: str | None,
                 kind: str | None = "process") -> Path:
    config = IO + _parameter("package", PACKAGE)
    if kind is not None:
        config += _parameter("TRITIUM_INSTANCE_KIND", kind)
    if env_path is not None:
        config += _parameter("EXECUTION_ENV_PATH", env_path)
    return add_model(repo, name, "env_probe", config)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, other_env: Path, bare_env: Path
           ) -> Iterator[TritiumProcess]:
    repo = tmp_path_factory.mktemp("env_repo")
    # The environment inside the model's directory, named through the keyword.
    in_dir = _probe_model(repo, "venv_dir", "$$TRITON_MODEL_DIRECTORY/env")
    (in_dir / "env").symlink_to(other_env, target_is_directory=True)
    tarred = _probe_model(repo, "venv_tar", "$$TRITON_MODEL_DIRECTORY/env.tar.gz")
    with tarfile.open(tarred / "env.tar.gz", "w:gz") as tar:
        tar.add(other_env, arcname=".")
    _probe_model(repo, "no_env", None)
    _probe_model(repo, "env_without_kind", str(other_env), kind=None)
    _probe_model(repo, "thread_kind", None, kind="thread")
    _probe_model(repo, "missing_env", "$$TRITON_MODEL_DIRECTORY/nowhere")
    _probe_model(repo, "no_numpy", str(bare_env))
    cache = tmp_path_factory.mktemp("env_cache") / "private"
    process = TritiumProcess(repo, env={"TRITIUM_EXECUTION_ENV_CACHE": str(cache)}).start(120)
    process.cache = cache  # type: ignore[attr-defined]
    yield process
    assert process.stop() == 0, process.log()


def probe(server: TritiumProcess, model: str) -> dict[str, Any]:
    body = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [0]}]}
    reply = requests.post(f"http://{server.http_url}/v2/models/{model}/infer", json=body,
                          timeout=60)
    assert reply.status_code == 200, reply.text
    return dict(json.loads(reply.json()["outputs"][0]["data"][0]))


def index(server: TritiumProcess) -> dict[str, dict[str, Any]]:
    reply = requests.post(f"http://{server.http_url}/v2/repository/index", timeout=30)
    return {row["name"]: row for row in reply.json()}


def test_a_venv_directory_runs_its_interpreter_and_its_package_version(
        server: TritiumProcess, other_env: Path) -> None:
    facts = probe(server, "venv_dir")
    assert facts["executable"].startswith(str(other_env))
    assert facts["prefix"] == str(other_env)
    assert facts["version"] == ENV_VERSION != importlib.metadata.version(PACKAGE)
    assert facts["file"].startswith(str(other_env))


def test_a_model_naming_an_environment_gets_a_process_whatever_the_default_kind(
        server: TritiumProcess, other_env: Path) -> None:
    """The server runs with the default kind (thread); only a process can run another
    Python, so EXECUTION_ENV_PATH without TRITIUM_INSTANCE_KIND means process."""
    facts = probe(server, "env_without_kind")
    assert facts["executable"].startswith(str(other_env)) and facts["pid"] != server.pid
    assert facts["version"] == ENV_VERSION


def test_a_tarball_is_extracted_into_the_private_cache_and_run_from_there(
        server: TritiumProcess) -> None:
    cache: Path = server.cache  # type: ignore[attr-defined]
    facts = probe(server, "venv_tar")
    assert facts["executable"].startswith(str(cache))
    assert facts["version"] == ENV_VERSION
    assert (cache.stat().st_mode & 0o777) == 0o700
    assert len([p for p in cache.iterdir() if not p.name.startswith(".")]) == 1


def test_without_an_environment_the_servers_packages_serve(server: TritiumProcess) -> None:
    for model in ("no_env", "thread_kind"):
        facts = probe(server, model)
        assert facts["version"] == importlib.metadata.version(PACKAGE), model


def test_a_model_process_sees_what_tritons_stub_gives_it(server: TritiumProcess) -> None:
    """Triton's stub embeds Python without arguments (sys.argv == [""]) and appends the
    model's version and model directories to sys.path before importing it; it may run on
    every core the server may use."""
    for model in ("venv_dir", "no_env"):
        facts = probe(server, model)
        assert facts["argv"] == [""], model
        assert facts["dirs_on_path"] == [True, True], model
        assert facts["pid"] != server.pid
        # Not the one home core the server's loop thread (which spawned it) is kept on.
        assert facts["cores"] == sorted(os.sched_getaffinity(0)), model


def test_an_environment_that_cannot_serve_leaves_its_model_unavailable_with_the_reason(
        server: TritiumProcess, bare_env: Path) -> None:
    rows = index(server)
    missing = rows["missing_env"]
    assert missing["state"] == "UNAVAILABLE"
    assert "Failed to get the canonical path for" in missing["reason"]
    assert "missing_env/nowhere" in missing["reason"]
    no_numpy = rows["no_numpy"]
    assert no_numpy["state"] == "UNAVAILABLE"
    assert "cannot import numpy" in no_numpy["reason"] and str(bare_env) in no_numpy["reason"]
    assert rows["venv_dir"]["state"] == "READY"
