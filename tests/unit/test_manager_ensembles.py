"""ModelManager and ensembles, with a fake backend: nested ensembles, a cycle between
ensembles, unload_dependents through a nested ensemble, re-checks after a reload."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tritium.core.errors import TritiumError
from tritium.core.service import InferenceService
from tritium.ensemble.handle import EnsembleModel
from tritium.ensemble.plan import EnsemblePlan
from tritium.execution.backend import InstanceInfo
from tritium.execution.kinds import InstanceBuilder
from tritium.repository.manager import ControlMode, ModelManager

CONFIG = """backend: "python"
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [1] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [1] }]
"""


class FakeBackend:
    decoupled = False

    def __init__(self, info: InstanceInfo):
        self.info = info

    def execute(self, requests: list[Any]) -> None:
        return None

    def finalize(self) -> None:
        return None


def add_plain(repo: Path, name: str, config: str = CONFIG) -> None:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(config)


def add_ensemble(repo: Path, name: str, composing: str) -> None:
    """IN -> ``composing`` -> OUT, where the composing model reads INPUT0/IN and writes
    OUTPUT0 (a plain model), or IN/OUT (another such ensemble)."""
    io = ("INPUT0", "OUTPUT0") if composing.startswith("m") else ("IN", "OUT")
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(f"""platform: "ensemble"
input [{{ name: "IN" data_type: TYPE_FP32 dims: [1] }}]
output [{{ name: "OUT" data_type: TYPE_FP32 dims: [1] }}]
ensemble_scheduling {{ step {{ model_name: "{composing}" model_version: -1
  input_map {{ key: "{io[0]}" value: "IN" }} output_map {{ key: "{io[1]}" value: "OUT" }} }} }}
""")


Scenario = Callable[[ModelManager], Awaitable[None]]


def run(repo: Path, mode: ControlMode, scenario: Scenario) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        service: InferenceService | None = None

        def create_ensemble(plan: EnsemblePlan, config: Any, version: int) -> EnsembleModel:
            assert service is not None
            return EnsembleModel(plan, config, service, version)

        manager = ModelManager([repo], loop,
                               InstanceBuilder("thread", lambda info, *_: FakeBackend(info)),
                               None, mode,
                               unload_timeout_s=0.3, create_ensemble=create_ensemble)
        service = InferenceService(manager, loop)
        await manager.load_startup_models([])
        try:
            await scenario(manager)
        finally:
            await manager.shutdown()

    asyncio.run(main())


def ready(manager: ModelManager) -> set[str]:
    return {row.name for row in manager.index(ready_only=True)}


def test_nested_ensembles_load_innermost_first(tmp_path: Path) -> None:
    add_plain(tmp_path, "m")
    add_ensemble(tmp_path, "inner", "m")
    add_ensemble(tmp_path, "outer", "inner")

    async def scenario(manager: ModelManager) -> None:
        await manager.load("outer", {})
        assert ready(manager) == {"m", "inner", "outer"}
        # unload_dependents reaches through the inner ensemble to its model.
        await manager.unload("outer", {"unload_dependents": True})
        assert ready(manager) == set()

    run(tmp_path, ControlMode.EXPLICIT, scenario)


def test_a_cycle_between_two_ensembles(tmp_path: Path) -> None:
    """Triton: "circular dependency between ensembles: <start> -> ... -> <last> -> <start>"."""
    add_ensemble(tmp_path, "e1", "e2")
    add_ensemble(tmp_path, "e2", "e1")

    async def scenario(manager: ModelManager) -> None:
        with pytest.raises(TritiumError) as info:
            await manager.load("e1", {})
        assert "circular dependency between ensembles: e1 -> ... -> e2 -> e1" in info.value.message
        assert ready(manager) == set()

    run(tmp_path, ControlMode.EXPLICIT, scenario)


def test_startup_orders_every_ensemble_after_its_models(tmp_path: Path) -> None:
    add_plain(tmp_path, "m")
    add_ensemble(tmp_path, "a_outer", "b_inner")  # sorted before what it needs
    add_ensemble(tmp_path, "b_inner", "m")

    async def scenario(manager: ModelManager) -> None:
        assert ready(manager) == {"m", "a_outer", "b_inner"}
        assert manager.is_ready()

    run(tmp_path, ControlMode.NONE, scenario)


def test_a_reload_that_breaks_the_ensemble_takes_it_out_until_fixed(tmp_path: Path) -> None:
    add_plain(tmp_path, "m")
    add_ensemble(tmp_path, "ens", "m")

    async def scenario(manager: ModelManager) -> None:
        await manager.load("ens", {})
        (tmp_path / "m" / "config.pbtxt").write_text(CONFIG.replace("TYPE_FP32", "TYPE_INT32"))
        await manager.load("m", {})
        assert ready(manager) == {"m"}
        await manager.wait_unloaded()  # UNLOADING counts as not ready, as in Triton
        assert manager.is_ready()  # taken out, not failed: the server stays ready
        (tmp_path / "m" / "config.pbtxt").write_text(CONFIG)
        await manager.load("m", {})
        assert ready(manager) == {"m", "ens"}

    run(tmp_path, ControlMode.EXPLICIT, scenario)


def test_a_step_without_model_version_asks_for_version_0(tmp_path: Path) -> None:
    """Triton reads an omitted step version as 0, which no model has: the ensemble is
    refused, and only -1 means the latest version."""
    add_plain(tmp_path, "m")
    add_ensemble(tmp_path, "e", "m")
    config = tmp_path / "e" / "config.pbtxt"
    config.write_text(config.read_text().replace(" model_version: -1", ""))

    async def scenario(manager: ModelManager) -> None:
        with pytest.raises(TritiumError) as info:
            await manager.load("e", {})
        assert ("ensemble 'e' depends on 'm' whose required version 0 is not loaded."
                in info.value.message)
        assert ready(manager) == {"m"}

    run(tmp_path, ControlMode.EXPLICIT, scenario)


def test_ensembles_nested_past_the_bound_are_refused_alone(tmp_path: Path) -> None:
    """A chain of ensembles 400 deep (once a RecursionError that stopped the server): each
    with more than MAX_DEPTH levels under it is refused from the configs, before anything
    under it loads; one within the bound loads, under the refused ones or not."""
    from tritium.ensemble.validation import MAX_DEPTH

    add_plain(tmp_path, "m")
    previous = "m"
    for level in range(400):
        add_ensemble(tmp_path, f"e{level}", previous)
        previous = f"e{level}"

    async def scenario(manager: ModelManager) -> None:
        with pytest.raises(TritiumError) as info:
            await manager.load("e399", {})
        assert info.value.message.endswith(f"ensemble 'e399' has ensembles nested more than "
                                      f"{MAX_DEPTH} levels deep under it, the most allowed")
        assert ready(manager) == set()
        await manager.load(f"e{MAX_DEPTH}", {})  # MAX_DEPTH ensembles under it
        assert f"e{MAX_DEPTH}" in ready(manager) and "e0" in ready(manager)
        with pytest.raises(TritiumError):
            await manager.load(f"e{MAX_DEPTH + 1}", {})

    run(tmp_path, ControlMode.EXPLICIT, scenario)


def test_an_ensemble_of_too_many_steps_is_refused(tmp_path: Path) -> None:
    from tritium.ensemble.validation import MAX_STEPS

    add_plain(tmp_path, "m")
    steps = "".join(
        f'step {{ model_name: "m" model_version: -1 input_map {{ key: "INPUT0" value: '
        f'"{"IN" if i == 0 else f"t{i}"}" }} output_map {{ key: "OUTPUT0" value: '
        f'"{"OUT" if i == MAX_STEPS else f"t{i + 1}"}" }} }}\n' for i in range(MAX_STEPS + 1))
    (tmp_path / "long" / "1").mkdir(parents=True)
    (tmp_path / "long" / "config.pbtxt").write_text(
        'platform: "ensemble"\ninput [{ name: "IN" data_type: TYPE_FP32 dims: [1] }]\n'
        'output [{ name: "OUT" data_type: TYPE_FP32 dims: [1] }]\n'
        f"ensemble_scheduling {{ {steps} }}\n")

    async def scenario(manager: ModelManager) -> None:
        with pytest.raises(TritiumError) as info:
            await manager.load("long", {})
        assert f"has {MAX_STEPS + 1} steps, more than the {MAX_STEPS} allowed" in \
            info.value.message

    run(tmp_path, ControlMode.EXPLICIT, scenario)
