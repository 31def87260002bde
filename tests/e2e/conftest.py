"""Fixtures: one shared tritium server on the test model repository."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server_process import TritiumProcess
from tests.zoo import build_repository


@pytest.fixture(scope="session")
def record_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("records")


@pytest.fixture(scope="session")
def repository(tmp_path_factory: pytest.TempPathFactory, record_dir: Path) -> Path:
    return build_repository(tmp_path_factory.mktemp("repo"), record_dir)


@pytest.fixture(scope="session")
def server(repository: Path) -> Iterator[TritiumProcess]:
    process = TritiumProcess(repository).start()
    yield process
    code = process.stop()
    assert code == 0, process.log()
