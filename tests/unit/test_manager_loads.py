"""ModelManager loads as Triton stages them: what is refused before model code runs changes
nothing (no entry, no readiness change, no directory); what fails in model code counts
against strict readiness until the model is unloaded or loads."""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_manager import FakeBackend, add_model
from tritium.core.errors import ErrorCode, TritiumError
from tritium.execution.backend import InstanceInfo
from tritium.execution.kinds import InstanceBuilder
from tritium.repository.loaded import LoadedModel
from tritium.repository.manager import ControlMode, ModelManager
from tritium.repository.overrides import DIR_PREFIX

IO = {"backend": "python",
      "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
      "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [1]}]}
Scenario = Callable[[ModelManager], Awaitable[None]]


def backend(info: InstanceInfo, *_: Any) -> FakeBackend:
    if "fails" in info.model_name:
        raise RuntimeError("initialize refuses")
    return FakeBackend(info, [])


def run(repo: Path, scenario: Scenario, mode: ControlMode = ControlMode.EXPLICIT) -> None:
    async def main() -> None:
        manager = ModelManager([repo], asyncio.get_running_loop(),
                               InstanceBuilder("thread", backend), None, mode,
                               unload_timeout_s=0.3)
        await manager.load_startup_models([])
        try:
            await scenario(manager)
        finally:
            await manager.shutdown()

    asyncio.run(main())


async def refused(call: Awaitable[None], words: str) -> None:
    with pytest.raises(TritiumError) as caught:
        await call
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert words in caught.value.message


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    where = tmp_path / "tmp"
    where.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(where))
    return where


def listing(directory: Path) -> list[Path]:
    return sorted(directory.iterdir())


def overrides(**config: Any) -> dict[str, Any]:
    return {"config": json.dumps({**IO, **config}), "file:1/model.py": b"# model"}


def test_refusals_before_model_code_leave_no_trace(tmp_path: Path, private_tmp: Path) -> None:
    add_model(tmp_path / "repo", "m")

    async def scenario(manager: ModelManager) -> None:
        await refused(manager.load("missing", {}), "no model directory")
        await refused(manager.load("../m", {}), "invalid model name")
        await refused(manager.load("fresh", overrides(name="other")), "directory name")
        await refused(manager.load("fresh", overrides(instance_group=[{"count": 10**6}])),
                      "'instance_group' count")
        assert manager.is_ready()
        assert {row.name for row in manager.index(False)} == {"m"}
        assert len(manager._locks) == 0
        assert listing(private_tmp) == []

    run(tmp_path / "repo", scenario)


def test_a_model_failing_in_its_code_counts_until_unloaded(tmp_path: Path,
                                                          private_tmp: Path) -> None:
    add_model(tmp_path / "repo", "fails")

    async def scenario(manager: ModelManager) -> None:
        await refused(manager.load("fails", {}), "initialize refuses")
        assert not manager.is_ready()
        await manager.unload("fails", {})
        assert manager.is_ready()
        await refused(manager.load("fails_upload", overrides()), "initialize refuses")
        assert not manager.is_ready()
        assert listing(private_tmp) == []  # nothing runs from it: removed at once
        await manager.unload("fails_upload", {})
        assert manager.is_ready()

    run(tmp_path / "repo", scenario)


def test_the_override_directory_lives_as_long_as_its_versions(tmp_path: Path,
                                                             private_tmp: Path) -> None:
    add_model(tmp_path / "repo", "m")

    async def scenario(manager: ModelManager) -> None:
        await manager.load("up", overrides())
        [holder] = listing(private_tmp)
        assert holder.name.startswith(DIR_PREFIX)
        served = manager.resolve("up", None)
        assert isinstance(served, LoadedModel) and served.model_dir == holder / "up"
        await refused(manager.load("up", overrides(name="other")), "directory name")
        assert listing(private_tmp) == [holder]  # the serving one stays
        await manager.unload("up", {})
        async with asyncio.timeout(10):
            while holder.exists():  # noqa: ASYNC110 - removed by a background drain
                await asyncio.sleep(0.01)

    run(tmp_path / "repo", scenario)


def test_repository_names_follow_the_python_backend_rule(tmp_path: Path) -> None:
    add_model(tmp_path / "repo", "a(b)")
    add_model(tmp_path / "repo", "fine")

    async def scenario(manager: ModelManager) -> None:
        rows = {row.name: row for row in manager.index(False)}
        assert "must not contain any of" in rows["a(b)"].reason
        assert rows["fine"].reason == ""
        assert not manager.is_ready()  # a model of the startup set failed

    run(tmp_path / "repo", scenario, ControlMode.NONE)



@pytest.mark.parametrize("limit", [1, 2])
def test_load_concurrency_bounds_the_versions_starting_at_once(
        tmp_path: Path, limit: int) -> None:
    """--model-load-thread-count: no more versions start at once than it allows."""
    for name in ("a", "b", "c", "d"):
        add_model(tmp_path / "repo", name)
    starting: list[int] = [0, 0]  # now, most seen
    lock = threading.Lock()

    def slow_backend(info: InstanceInfo, _: Any) -> FakeBackend:
        with lock:
            starting[0] += 1
            starting[1] = max(starting)
        time.sleep(0.1)
        with lock:
            starting[0] -= 1
        return FakeBackend(info, [])

    async def main() -> None:
        manager = ModelManager([tmp_path / "repo"], asyncio.get_running_loop(),
                               InstanceBuilder("thread",
                                               lambda info, *_: slow_backend(info, None)),
                               None, ControlMode.NONE, load_concurrency=limit)
        await manager.load_startup_models([])
        try:
            assert sorted(e.name for e in manager.index(ready_only=True)) == ["a", "b", "c",
                                                                              "d"]
        finally:
            await manager.shutdown()

    asyncio.run(main())
    assert 1 <= starting[1] <= limit


@pytest.mark.parametrize(("retries", "state"), [(0, "UNAVAILABLE"), (1, "READY")])
def test_load_retries_try_a_failed_version_again(tmp_path: Path, retries: int,
                                                 state: str) -> None:
    """--model-load-retry-count: a version that fails once loads on its second try."""
    add_model(tmp_path / "repo", "flaky")
    tries: list[int] = []

    def flaky_backend(info: InstanceInfo, _: Any) -> FakeBackend:
        tries.append(1)
        if len(tries) == 1:
            raise RuntimeError("not this time")
        return FakeBackend(info, [])

    async def main() -> None:
        manager = ModelManager([tmp_path / "repo"], asyncio.get_running_loop(),
                               InstanceBuilder("thread",
                                               lambda info, *_: flaky_backend(info, None)),
                               None, ControlMode.NONE, load_retries=retries)
        await manager.load_startup_models([])
        try:
            assert [e.state.value for e in manager.index(ready_only=False)] == [state]
        finally:
            await manager.shutdown()

    asyncio.run(main())
    assert len(tries) == retries + 1
