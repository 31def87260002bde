"""How ensembles depend on their composing models, as Triton's model repository manager
has it: the manager's part that loads, checks, re-checks and unloads along those edges.

- Loading an ensemble loads nothing of its own, but needs its composing models: in
  explicit mode it loads those not serving (as dependencies, not "explicit" loads); in
  the other modes they load first at startup and with each poll.
- An ensemble is checked against its composing models once they serve (Triton's
  ValidateEnsembleConfig), and checked again whenever one of them is reloaded.
- A serving ensemble whose composing model leaves is taken out with it, and comes back
  when the model does; an ensemble unloaded on purpose stays unloaded.
- ``unload_dependents`` also unloads the composing models that were loaded only for it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tritium.core.errors import TritiumError
from tritium.core.names import plain_name, qualified
from tritium.ensemble.plan import EnsemblePlan
from tritium.ensemble.validation import (
    MAX_DEPTH,
    EnsembleConfigError,
    circular_dependency,
    dependency_failed,
    dependency_not_loaded,
    is_ensemble,
    nested_too_deep,
    unavailable_models,
    validate_against_composing,
    version_not_loaded,
)
from tritium.repository.config import read_model_config
from tritium.repository.poll import fingerprint

if TYPE_CHECKING:
    from tritium.core.model import ModelHandle
    from tritium.repository.locks import NameLocks
    from tritium.repository.manager import ControlMode, ModelEntry

log = logging.getLogger("tritium.repository")

_UNLOADED = "unloaded"  # the manager's UNLOADED reason


class DependencyRules:
    """Mixed into ModelManager; uses its entries, locks and install steps."""

    if TYPE_CHECKING:
        models: dict[str, ModelEntry]
        control_mode: ControlMode
        repositories: list[Path]
        _locks: NameLocks
        _installs: int
        _ambiguous: dict[str, list[str]]

        def _scan(self) -> tuple[dict[str, Path], dict[str, str]]: ...

        async def _install(self, name: str, model_dir: Path, overrides: Any = None,
                           holder: Any = None, on_failure: Any = ...,
                           chain: tuple[str, ...] = ()) -> None: ...

        async def _start_versions(self, entry: ModelEntry, model_dir: Path,
                                  versions: list[int], config: Any) -> dict[int, Any]: ...

        def _swap(self, entry: ModelEntry, model_dir: Path, models: dict[int, Any],
                  failures: dict[int, str], holder: Any) -> None: ...

        def _serving(self, name: str) -> bool: ...

        def _retire_entry(self, name: str) -> None: ...

        def ready_versions(self, name: str) -> list[int]: ...

        def resolve_member(self, key: str, version: int | None) -> ModelHandle: ...

    # -- loading an ensemble ---------------------------------------------------------------
    async def _prepare_ensemble(self, entry: ModelEntry, config: Any, chain: tuple[str, ...],
                                load_composing: bool = True) -> Any:
        """The ensemble's config once its composing models serve and agree with it, with
        ``decoupled`` set as Triton sets it; raises TritiumError (the ensemble's reason)."""
        config = self._with_namespaces(entry, config)
        plan = EnsemblePlan.from_config(config)
        entry.composing = plan.composing_models
        if load_composing:
            if not chain:  # the top of a load: judged whole before anything under it loads
                self._check_nesting(config.name, plan)
            await self._ensure_composing(config.name, plan, (*chain, config.name))
        entry.checked_at = self._installs
        composing = self._composing_configs(config.name, plan)
        decoupled = validate_against_composing(config, composing)
        completed = type(config)()
        completed.CopyFrom(config)
        completed.model_transaction_policy.decoupled = decoupled
        return completed

    async def _ensure_composing(self, name: str, plan: EnsemblePlan,
                                chain: tuple[str, ...]) -> None:
        if len(chain) > 2 * MAX_DEPTH:  # a backstop: _check_nesting judged the top
            raise nested_too_deep(name)
        found, _ = self._scan()
        missing = [m for m in plan.composing_models if m not in found and not self._serving(m)]
        if missing:
            raise unavailable_models(name, [plain_name(m) for m in missing])
        for model in plan.composing_models:
            if model in chain:
                raise circular_dependency(plain_name(model), name)
            if model not in found:
                continue  # serving from a load request's own files
            async with self._locks.hold(model):
                if not self._wants_install(model, found[model]):
                    continue
                entry = self.models.get(model)
                # Triton: a model loaded only as a dependency is not "explicitly loaded".
                explicit = entry is not None and entry.explicit and self._serving(model)
                log.info("model '%s' is loading as a composing model of '%s'", model, name)
                await self._install(model, found[model], chain=chain)
                if model in self.models:
                    self.models[model].explicit = explicit

    def _check_nesting(self, name: str, plan: EnsemblePlan) -> None:
        """Refuse an ensemble with ensembles nested more than MAX_DEPTH deep under it, from
        their configs, level by level (a cycle is left to the load to report)."""
        found, _ = self._scan()
        seen = {name}
        level = {m for m in plan.composing_models if m in found}
        for depth in range(1, MAX_DEPTH + 2):
            below: set[str] = set()
            for model in level - seen:
                seen.add(model)
                try:
                    config = read_model_config(found[model], auto_completing=False).config
                except TritiumError:
                    continue  # its own load will say why
                if not is_ensemble(config):
                    continue
                if depth > MAX_DEPTH:
                    raise nested_too_deep(name)
                below.update(step.model_name for step in config.ensemble_scheduling.step
                             if step.model_name in found)
            if not below - seen:
                return
            level = below

    def _wants_install(self, name: str, model_dir: Path) -> bool:
        """Poll and startup: new or changed since last tried. Explicit mode: also any
        model not serving, as a load request retries what failed before."""
        entry = self.models.get(name)
        if entry is None or entry.fingerprint != fingerprint(model_dir):
            return True
        return self.control_mode.value == "explicit" and not self._serving(name)

    def _attempted(self, name: str, model_dir: Path) -> bool:
        entry = self.models.get(name)
        return (entry is not None and bool(entry.fingerprint)
                and entry.fingerprint == fingerprint(model_dir))

    def _composing_configs(self, name: str, plan: EnsemblePlan) -> dict[str, Any]:
        """Each composing model's config (its latest ready version's, as Triton checks)."""
        configs: dict[str, Any] = {}
        for step in plan.steps:
            model, key = step.model_name, step.model_key
            ready = self.ready_versions(key)
            if not ready:
                raise self._dependency_error(name, key)
            if step.model_version != -1 and step.model_version not in ready:
                raise version_not_loaded(name, model, step.model_version)
            configs[model] = self.resolve_member(key, None).config
        return configs

    def _with_namespaces(self, entry: ModelEntry, config: Any) -> Any:
        """``config`` with Triton's ``model_namespace`` on each step whose model's name
        several repositories have: the ensemble's own repository, where it has that model
        (elsewhere none of them is a match, as in Triton)."""
        steps = config.ensemble_scheduling.step
        if not any(step.model_name in self._ambiguous for step in steps):
            return config
        namespace = str(entry.model_dir.parent) if entry.model_dir is not None else ""
        completed = type(config)()
        completed.CopyFrom(config)
        for step in completed.ensemble_scheduling.step:
            keys = self._ambiguous.get(step.model_name, ())
            if qualified(step.model_name, namespace) in keys:
                step.model_namespace = namespace
        return completed

    def _dependency_error(self, name: str, key: str) -> EnsembleConfigError:
        entry, model = self.models.get(key), plain_name(key)
        if entry is None:
            return dependency_not_loaded(name, model)
        reasons = [entry.reason] + [f"version {v}: {s.reason}"
                                    for v, s in sorted(entry.versions.items()) if s.reason]
        failed = [r for r in reasons if r and not r.endswith(_UNLOADED)]
        if failed:
            return dependency_failed(name, model, "; ".join(failed))
        return dependency_not_loaded(name, model)

    # -- keeping ensembles in line with their composing models ----------------------------------
    async def _settle(self) -> None:
        """Re-check every ensemble whose composing models changed since it was checked,
        and take out every one whose composing model left; repeats for nested ensembles."""
        for _ in range(len(self.models) + 1):
            stale = [name for name, entry in sorted(self.models.items()) if self._stale(entry)]
            if not stale:
                return
            for name in stale:
                async with self._locks.hold(name):
                    entry = self.models.get(name)
                    if entry is not None and self._stale(entry):
                        await self._recheck(entry)

    def _stale(self, entry: ModelEntry) -> bool:
        if not entry.composing or entry.ensemble_config is None:
            return False
        serving = self._serving(entry.name)
        if not (serving or entry.awaiting):
            return False
        if serving and not all(self._serving(m) for m in entry.composing):
            return True
        return any(self.models[m].installed_at > entry.checked_at
                   for m in entry.composing if m in self.models)

    async def _recheck(self, entry: ModelEntry) -> None:
        gone = [m for m in entry.composing if not self._serving(m)]
        if gone:
            entry.checked_at = self._installs
            self._take_out(entry, f"its composing model '{gone[0]}' is not available")
            return
        try:
            config = await self._prepare_ensemble(entry, entry.ensemble_config, (),
                                                  load_composing=False)
        except TritiumError as exc:
            self._take_out(entry, exc.message)
            return
        assert entry.model_dir is not None
        started = await self._start_versions(entry, entry.model_dir,
                                             list(entry.ensemble_versions), config)
        models = {v: r for v, r in started.items() if not isinstance(r, str)}
        failures = {v: r for v, r in started.items() if isinstance(r, str)}
        self._swap(entry, entry.model_dir, models, failures, entry.override_dir)
        log.info("ensemble '%s' re-checked against its composing models", entry.name)

    def _take_out(self, entry: ModelEntry, why: str) -> None:
        """Triton unloads an ensemble that no longer holds together; it stays wanted."""
        if self._serving(entry.name):
            log.error("ensemble '%s' is unloaded: %s", entry.name, why)
            stamp = entry.fingerprint  # unchanged on disk: polling must not reload it
            self._retire_entry(entry.name)
            entry.fingerprint = stamp
        entry.awaiting = True

    # -- unload_dependents ----------------------------------------------------------------------
    async def _unload_composing(self, name: str) -> None:
        """Unload ``name``'s composing models (and theirs) that were loaded only as
        dependencies and that no other serving or waiting ensemble uses."""
        entry = self.models.get(name)
        removed = {name}
        queue = list(entry.composing) if entry is not None else []
        while queue:
            model = queue.pop(0)
            target = self.models.get(model)
            if target is None or target.explicit or model in removed or self._used(model, removed):
                continue
            log.info("model '%s' is unloading with '%s' (unload_dependents)", model, name)
            async with self._locks.hold(model):
                self._retire_entry(model)
            removed.add(model)
            queue.extend(target.composing)

    def _used(self, model: str, removed: set[str]) -> bool:
        return any(model in other.composing and (self._serving(other.name) or other.awaiting)
                   for other in self.models.values() if other.name not in removed)


def declared_ensembles(found: Mapping[str, Path], names: list[str],
                       config_name: str | None = None) -> set[str]:
    """Which of ``names`` are ensembles, by their config files (one that cannot be read
    counts as a plain model: its own load reports why)."""
    ensembles = set()
    for name in names:
        try:
            config = read_model_config(found[name], True, config_name).config
        except TritiumError:
            continue
        if is_ensemble(config):
            ensembles.add(name)
    return ensembles
