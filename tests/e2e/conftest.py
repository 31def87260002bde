"""Fixtures: one shared tritium server on the test model repository, per instance kind.

Every test that uses the shared ``server`` (or its ``repository`` and ``record_dir``) runs
once per python instance kind: thread instances and process instances
(``--python-instance-kind``), each kind with a repository and records of its own. pytest
groups the tests by kind, so one shared server runs at a time. A module whose tests cannot
depend on the kind (transport bytes, listener limits, TLS) sets ``INSTANCE_KINDS =
("thread",)`` and says why; ``TRITIUM_TEST_KINDS=process`` (comma-separated) narrows a run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.certificates import Pki, make_pki
from tests.server_process import TritiumProcess
from tests.zoo import build_repository

INSTANCE_KINDS = ("thread", "process")


def instance_kinds(kinds: tuple[str, ...] = INSTANCE_KINDS) -> tuple[str, ...]:
    """``kinds``, narrowed to those TRITIUM_TEST_KINDS names when it is set."""
    wanted = os.environ.get("TRITIUM_TEST_KINDS")
    return kinds if not wanted else tuple(k for k in kinds if k in wanted.split(","))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "instance_kind" not in metafunc.fixturenames:
        return
    kinds = instance_kinds(getattr(metafunc.module, "INSTANCE_KINDS", INSTANCE_KINDS))
    metafunc.parametrize("instance_kind", kinds, indirect=True, scope="session")


# Process-kind gaps outside these tests, by test name, with what is missing. Strict: once
# the gap is closed the test passes, fails as XPASS, and its entry goes.
PROCESS_KIND_GAPS: dict[str, str] = {}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        gap = PROCESS_KIND_GAPS.get(item.name)
        if gap is not None:
            item.add_marker(pytest.mark.xfail(reason=gap, strict=True))


@pytest.fixture(scope="session")
def instance_kind(request: pytest.FixtureRequest) -> str:
    kind: str = getattr(request, "param", "thread")
    return kind


@pytest.fixture(scope="session")
def record_dir(tmp_path_factory: pytest.TempPathFactory, instance_kind: str) -> Path:
    return tmp_path_factory.mktemp(f"records-{instance_kind}")


@pytest.fixture(scope="session")
def repository(tmp_path_factory: pytest.TempPathFactory, record_dir: Path,
               instance_kind: str) -> Path:
    return build_repository(tmp_path_factory.mktemp(f"repo-{instance_kind}"), record_dir)


@pytest.fixture(scope="session")
def server(repository: Path, instance_kind: str) -> Iterator[TritiumProcess]:
    process = TritiumProcess(repository, "--python-instance-kind", instance_kind)
    process.start(timeout=180)
    yield process
    code = process.stop()
    assert code == 0, process.log()


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA with server and client certificates, for the TLS tests."""
    return make_pki(tmp_path_factory.mktemp("pki"))
