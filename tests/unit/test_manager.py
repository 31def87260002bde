"""ModelManager lifecycle with a fake backend: control modes, unload drain, reload, poll."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tritium.core.cancellation import Cancellation
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.model import ModelState
from tritium.core.request import AdmittedRequest, InferenceRequest
from tritium.core.response import InferenceResponse
from tritium.core.service import InferenceService
from tritium.core.types import DataType, Tensor
from tritium.execution.backend import InstanceInfo
from tritium.execution.kinds import InstanceBuilder
from tritium.repository.manager import ControlMode, ModelManager
from tritium.repository.overrides import parse_overrides
from tritium.repository.poll import fingerprint

CONFIG = """backend: "python"
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [1] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [1] }]
"""


class FakeBackend:
    """Answers at once, unless the input is negative: then it never answers."""

    decoupled = False

    def __init__(self, info: InstanceInfo, finalized: list[str]):
        self.info = info
        self.finalized = finalized

    def execute(self, requests: list[AdmittedRequest]) -> None:
        for request in requests:
            value = request.request.inputs["INPUT0"].data
            if value[0] < 0:
                continue
            request.stream.send_nowait(InferenceResponse(outputs=[
                Tensor("OUTPUT0", DataType.FP32, (1,), value)]))

    def finalize(self) -> None:
        self.finalized.append(f"{self.info.model_name}/{self.info.model_version}")


def add_model(repo: Path, name: str, config: str = CONFIG, versions: tuple[int, ...] = (1,)
              ) -> Path:
    model_dir = repo / name
    for version in versions:
        (model_dir / str(version)).mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(config)
    return model_dir


Scenario = Callable[[ModelManager, InferenceService, list[str]], Awaitable[None]]


def run(repo: Path, mode: ControlMode, scenario: Scenario, startup: tuple[str, ...] = ()
        ) -> list[str]:
    finalized: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        manager = ModelManager([repo], loop, InstanceBuilder(
                                   "thread", lambda info, *_: FakeBackend(info, finalized)),
                               None, mode, unload_timeout_s=0.3)
        service = InferenceService(manager, loop)
        await manager.load_startup_models(list(startup))
        try:
            await scenario(manager, service, finalized)
        finally:
            await service.drain(0.0)
            await manager.shutdown()

    asyncio.run(main())
    return finalized


def request(model: str, value: float, service: InferenceService) -> InferenceRequest:
    data = np.array([value], dtype=np.float32)
    return InferenceRequest(model, {"INPUT0": Tensor("INPUT0", DataType.FP32, (1,), data)})


def states(manager: ModelManager) -> dict[str, tuple[ModelState, str]]:
    return {f"{e.name}/{e.version}": (e.state, e.reason) for e in manager.index(False)}


async def wait_for(condition: Callable[[], bool]) -> None:
    # The conditions change on instance threads and background tasks that offer no event.
    async with asyncio.timeout(10):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


# -- control modes --------------------------------------------------------------------------
@pytest.mark.parametrize("mode", [ControlMode.NONE, ControlMode.POLL])
def test_load_and_unload_are_refused_outside_explicit_mode(tmp_path: Path,
                                                           mode: ControlMode) -> None:
    add_model(tmp_path, "m")

    async def scenario(manager: ModelManager, service: InferenceService, _: list[str]) -> None:
        for call in (manager.load, manager.unload):
            with pytest.raises(TritiumError) as caught:
                await call("m", {})
            assert caught.value.code is ErrorCode.UNAVAILABLE
            assert "explicit" in caught.value.message

    run(tmp_path, mode, scenario)


def test_explicit_mode_loads_named_models_and_lists_the_rest(tmp_path: Path) -> None:
    add_model(tmp_path, "a")
    add_model(tmp_path, "b")

    async def scenario(manager: ModelManager, service: InferenceService, _: list[str]) -> None:
        assert states(manager) == {"a/1": (ModelState.READY, ""),
                                   "b/None": (ModelState.UNAVAILABLE, "unloaded")}
        assert manager.is_ready()
        await manager.load("b", {})
        assert states(manager)["b/1"] == (ModelState.READY, "")

    run(tmp_path, ControlMode.EXPLICIT, scenario, startup=("a",))


# -- unload -----------------------------------------------------------------------------------
def test_unload_drains_then_finalizes(tmp_path: Path) -> None:
    add_model(tmp_path, "m")

    async def scenario(manager: ModelManager, service: InferenceService,
                       finalized: list[str]) -> None:
        await manager.unload("m", {})
        assert states(manager)["m/1"] == (ModelState.UNLOADING, "")
        with pytest.raises(TritiumError) as caught:
            service.submit(request("m", 1.0, service), Cancellation(service.loop))
        assert caught.value.code is ErrorCode.UNAVAILABLE
        await wait_for(lambda: states(manager)["m/1"] == (ModelState.UNAVAILABLE, "unloaded"))
        assert finalized == ["m/1"]
        assert manager.is_ready()  # unloaded on purpose: still ready

    assert run(tmp_path, ControlMode.EXPLICIT, scenario, startup=("*",)) == ["m/1"]


def test_unload_cancels_a_request_that_never_finishes(tmp_path: Path) -> None:
    add_model(tmp_path, "m")

    async def scenario(manager: ModelManager, service: InferenceService, _: list[str]) -> None:
        stream = service.submit(request("m", -1.0, service), Cancellation(service.loop))
        await manager.unload("m", {})
        async with asyncio.timeout(5):
            response = await stream.receive()
        assert response.error is not None and "model unloaded" in response.error.message
        assert service.in_flight() == []

    run(tmp_path, ControlMode.EXPLICIT, scenario, startup=("m",))


# -- reload -------------------------------------------------------------------------------------
def test_a_failed_reload_keeps_the_old_model_serving(tmp_path: Path) -> None:
    model_dir = add_model(tmp_path, "m")

    async def scenario(manager: ModelManager, service: InferenceService, _: list[str]) -> None:
        before = manager.resolve("m", None)
        (model_dir / "config.pbtxt").write_text("max_batch_size: -1\n")
        with pytest.raises(TritiumError) as caught:
            await manager.load("m", {})
        assert caught.value.code is ErrorCode.INVALID_ARG
        assert manager.resolve("m", None) is before
        assert states(manager)["m/1"] == (ModelState.READY, "")

    run(tmp_path, ControlMode.EXPLICIT, scenario, startup=("m",))


def test_reload_swaps_versions_and_retires_the_old_ones(tmp_path: Path) -> None:
    add_model(tmp_path, "m", versions=(1, 2))

    async def scenario(manager: ModelManager, service: InferenceService,
                       finalized: list[str]) -> None:
        old = manager.resolve("m", 2)
        override = {"config": json.dumps({"version_policy": {"specific": {"versions": [1]}},
                                          "backend": "python",
                                          "input": [{"name": "INPUT0", "data_type": "TYPE_FP32",
                                                     "dims": [1]}],
                                          "output": [{"name": "OUTPUT0",
                                                      "data_type": "TYPE_FP32",
                                                      "dims": [1]}]})}
        await manager.load("m", override)
        assert manager.resolve("m", None).version == 1
        assert manager.resolve("m", None) is not old
        await wait_for(lambda: "m/2" in finalized)
        assert states(manager)["m/2"] == (ModelState.UNAVAILABLE, "unloaded")

    run(tmp_path, ControlMode.EXPLICIT, scenario, startup=("m",))


# -- poll ---------------------------------------------------------------------------------------
def test_poll_sync_loads_added_and_unloads_removed_models(tmp_path: Path) -> None:
    add_model(tmp_path, "a")

    async def scenario(manager: ModelManager, service: InferenceService,
                       finalized: list[str]) -> None:
        add_model(tmp_path, "b")
        await manager.sync_with_repository()
        assert states(manager)["b/1"] == (ModelState.READY, "")
        for path in sorted((tmp_path / "a").rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        (tmp_path / "a").rmdir()
        await manager.sync_with_repository()
        await wait_for(lambda: finalized == ["a/1"])

    run(tmp_path, ControlMode.POLL, scenario)


def test_fingerprint_sees_edits_and_new_versions(tmp_path: Path) -> None:
    model_dir = add_model(tmp_path, "m")
    first = fingerprint(model_dir)
    assert fingerprint(model_dir) == first
    (model_dir / "2").mkdir()
    second = fingerprint(model_dir)
    assert second != first
    (model_dir / "__pycache__").mkdir()
    assert fingerprint(model_dir) == second  # Python's own caches are not a change
    (model_dir / "config.pbtxt").write_text(CONFIG + "\n# edited, longer\n")
    assert fingerprint(model_dir) != second


# -- overrides ----------------------------------------------------------------------------------
def test_overrides_decode_base64_and_bytes() -> None:
    overrides = parse_overrides("m", {
        "config": "{}", "file:1/model.py": base64.b64encode(b"code").decode(),
        "file:1/data/x.bin": b"\x00\x01", "unload_dependents": True})
    assert overrides.files == {"1/model.py": b"code", "1/data/x.bin": b"\x00\x01"}
    assert overrides.config is not None


@pytest.mark.parametrize("parameters, message", [
    ({"file:1/model.py": b"x"}, "'config' must be specified"),
    ({"config": "{}", "file:../evil.py": b"x"}, "invalid file override path"),
    ({"config": "{}", "file:/../abs.py": b"x"}, "invalid file override path"),
    ({"config": "{}", "file:1/model.py": "not base64!"}, "not valid base64"),
    ({"config": "[1]"}, "Invalid config override"),
])
def test_bad_overrides_are_invalid_arguments(parameters: dict[str, Any], message: str) -> None:
    with pytest.raises(TritiumError) as caught:
        parse_overrides("m", parameters)
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert message in caught.value.message


def test_shutdown_drain_cancels_what_is_left(tmp_path: Path) -> None:
    add_model(tmp_path, "m")

    async def scenario(manager: ModelManager, service: InferenceService, _: list[str]) -> None:
        stuck = service.submit(request("m", -1.0, service), Cancellation(service.loop))
        quick = service.submit(request("m", 1.0, service), Cancellation(service.loop))
        report = await service.drain(0.2)
        assert (report.drained, report.cancelled) == (1, 1)
        assert not service.is_ready()
        assert (await quick.receive()).error is None
        error = (await stuck.receive()).error
        assert error is not None and "server shutting down" in error.message
        with pytest.raises(TritiumError, match="shutting down"):
            service.submit(request("m", 1.0, service), Cancellation(service.loop))

    run(tmp_path, ControlMode.NONE, scenario)



def test_no_version_asked_for_is_the_newest_ready_one(tmp_path: Path) -> None:
    """Triton's version policy with several versions loaded: a request naming none is
    served by the highest-numbered READY version; named ones by their own."""
    add_model(tmp_path, "m", CONFIG + "version_policy: { all: {} }\n", versions=(3, 10, 7))

    async def scenario(manager: ModelManager, service: InferenceService, _: list[str]) -> None:
        assert manager.ready_versions("m") == [3, 7, 10]
        assert manager.resolve("m", None).version == 10
        assert manager.resolve("m", 7).version == 7
        await manager.unload("m", {})
        with pytest.raises(TritiumError, match="has no available versions"):
            manager.resolve("m", None)

    run(tmp_path, ControlMode.EXPLICIT, scenario, startup=("m",))
