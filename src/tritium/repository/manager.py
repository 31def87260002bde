"""The set of models a server knows: their versions, states, and their whole lifecycle.

Invariants:
- A request can only reach a version whose slot is READY; everything else (LOADING,
  UNLOADING, UNAVAILABLE) answers UNAVAILABLE from ``resolve``.
- Swapping a slot to a new ``LoadedModel`` happens in one step on the loop, so a request
  either went to the old model (which then drains) or goes to the new one; none is lost.
- Operations on one model name (load, unload, poll) run one at a time.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.model import IndexEntry, ModelState
from tritium.core.names import NAMESPACE_SEPARATOR, check_model_name, plain_name
from tritium.core.response_cache import ResponseCache
from tritium.ensemble.plan import EnsemblePlan
from tritium.ensemble.validation import is_ensemble
from tritium.execution.kinds import InstanceBuilder
from tritium.repository.config import (
    AutoComplete,
    PreparedConfig,
    available_versions,
    find_models,
    finish_model_config,
    prepare_model_config,
    read_model_config,
)
from tritium.repository.dependencies import DependencyRules, declared_ensembles
from tritium.repository.loaded import LoadedModel
from tritium.repository.locks import NameLocks
from tritium.repository.overrides import LoadOverrides, OverrideDir, parse_overrides
from tritium.repository.poll import fingerprint
from tritium.repository.served import EnsembleFactory, ServedVersion
from tritium.scheduling.rate_limiter import RateLimiter

log = logging.getLogger("tritium.repository")

UNLOADED = "unloaded"
_READY = ModelState.READY
_REACHABLE = (ModelState.READY, ModelState.UNLOADING)
# How long stopping a model may wait for its instances' finalize() before giving up on them.
FINALIZE_TIMEOUT_S = 10.0


class _OnFailure(enum.Enum):
    """What a failed load does besides logging: answer the API caller, or only record it
    in the index (startup and polling have no caller)."""

    RAISE = "raise"
    RECORD = "record"


class ControlMode(enum.Enum):
    NONE = "none"
    EXPLICIT = "explicit"
    POLL = "poll"


@dataclass(slots=True)
class VersionEntry:
    state: ModelState
    reason: str = ""
    model: ServedVersion | None = None


@dataclass(slots=True)
class ModelEntry:
    name: str
    model_dir: Path | None
    versions: dict[int, VersionEntry] = field(default_factory=dict)
    # A model-level failure (bad config, duplicate name) before any version exists.
    reason: str = ""
    # What the directory looked like when last loaded; poll mode compares against it.
    fingerprint: tuple[Any, ...] = ()
    # The private model directory a load with file overrides wrote; removed with the
    # versions that run from it.
    override_dir: OverrideDir | None = None
    # An ensemble's composing models, from the config last installed or tried.
    composing: tuple[str, ...] = ()
    # Loaded on request (or at startup), not only as an ensemble's composing model:
    # unloading that ensemble with unload_dependents leaves it loaded.
    explicit: bool = True
    # When its versions were last swapped in (a counter): an ensemble older than one of
    # its composing models is checked against it again.
    installed_at: int = 0
    # An ensemble: the counter when it was last checked against its composing models.
    checked_at: int = 0
    # An ensemble taken out because a composing model left; it returns with the model.
    awaiting: bool = False
    # An ensemble's config as installed (before its composing models were checked), and
    # its versions: what a re-check after a composing model's reload starts from.
    ensemble_config: Any = None
    # Its last load, asked for through the load API, was refused from its configs: shown as
    # failed in the index, but not a failed model for strict readiness.
    refused: bool = False
    ensemble_versions: tuple[int, ...] = ()
    # The slot of the highest READY version, as ``resolve`` last found it (None: look
    # again). Only ``_swap`` makes a version READY, and it clears this; a slot that left
    # READY since is noticed by its state.
    latest: VersionEntry | None = None
    # ``name`` is a key qualified by its repository (--model-namespacing): only the
    # ensembles of that repository reach it.
    namespaced: bool = field(init=False)

    def __post_init__(self) -> None:
        self.namespaced = NAMESPACE_SEPARATOR in self.name


class ModelManager(DependencyRules):
    """Implements ``tritium.core.model.ModelRepository``."""

    def __init__(
        self,
        repositories: list[Path],
        loop: asyncio.AbstractEventLoop,
        instances: InstanceBuilder,
        auto_complete: AutoComplete | None,
        control_mode: ControlMode = ControlMode.NONE,
        unload_timeout_s: float = 30.0,
        create_ensemble: EnsembleFactory | None = None,
        load_concurrency: int | None = None,
        load_retries: int = 0,
        response_cache: ResponseCache | None = None,
        config_name: str | None = None,
        namespacing: bool = False,
        rate_limiter: RateLimiter | None = None,
        instrument: Callable[[ServedVersion], None] | None = None,
    ):
        self.repositories = repositories
        self.loop = loop
        self.instances = instances  # chooses each model's instance kind and builds them
        self.auto_complete = auto_complete
        self.control_mode = control_mode
        # How long an unloaded (or replaced) version's requests may run before UNLOADED.
        self.unload_timeout_s = unload_timeout_s
        self.models: dict[str, ModelEntry] = {}
        self._locks = NameLocks()
        # Tasks draining and stopping versions taken out of service; shutdown awaits them.
        self._retiring: set[asyncio.Task[None]] = set()
        self.create_ensemble = create_ensemble
        self._installs = 0  # counts swaps, for ModelEntry.installed_at
        # --model-load-thread-count: versions whose instances start at the same time.
        self._load_slots = (asyncio.Semaphore(load_concurrency)
                            if load_concurrency is not None else None)
        self.load_retries = load_retries  # --model-load-retry-count
        self.response_cache = response_cache  # --cache-config; None: no caching
        # --model-config-name: read configs/<name>.pbtxt where a model has one.
        self.config_name = config_name
        self.rate_limiter = rate_limiter  # --rate-limit execution_count; None: off
        # --model-namespacing: a name in several repositories -> the keys of its models.
        self.namespacing = namespacing
        self._ambiguous: dict[str, list[str]] = {}
        # Called with each version built, before it serves (metrics that observe requests).
        self.instrument = instrument

    def _scan(self) -> tuple[dict[str, Path], dict[str, str]]:
        """``find_models`` of the repositories; notes which names several of them share."""
        found, broken = find_models(self.repositories, self.namespacing)
        ambiguous: dict[str, list[str]] = {}
        for key in found:
            if NAMESPACE_SEPARATOR in key:
                ambiguous.setdefault(plain_name(key), []).append(key)
        self._ambiguous = ambiguous
        return found, broken

    def _keys_for(self, name: str) -> list[str]:
        """The models a load or unload of ``name`` acts on: every model of that name, as
        Triton's namespacing has it."""
        return self._ambiguous.get(name) or [name]

    # -- startup -----------------------------------------------------------------
    async def load_startup_models(self, names: list[str]) -> None:
        """Load what the control mode says to load at startup (``*`` means all)."""
        found, broken = self._scan()
        everything = self.control_mode is not ControlMode.EXPLICIT or "*" in names
        for name, reason in broken.items():
            if everything or name in names:  # one never asked for does not fail startup
                self.models[name] = ModelEntry(name, None, reason=reason)
        wanted = sorted(found)
        if not everything:
            wanted = [n for n in wanted if plain_name(n) in names]
            for name in names:
                if name not in found and name not in broken and name not in self._ambiguous:
                    self.models[name] = ModelEntry(name, None, reason="model not found")
            for name in sorted(found.keys() - set(wanted)):
                self.models[name] = ModelEntry(name, found[name], reason=UNLOADED)
        # Plain models first, all at once; then each ensemble, which loads or checks its
        # composing models (nested ensembles first) before itself.
        ensembles = await asyncio.to_thread(declared_ensembles, found, wanted, self.config_name)
        await asyncio.gather(*(self._install(name, found[name])
                               for name in wanted if name not in ensembles))
        for name in sorted(ensembles):
            if self._attempted(name, found[name]):
                continue  # already loaded as a composing model of another ensemble
            await self._install(name, found[name])

    # -- load, reload, unload ------------------------------------------------------
    async def load(self, name: str, parameters: Mapping[str, Any]) -> None:
        """Load or reload ``name``; returns once it is READY, raises if it failed.

        Override files are checked completely before any is written, and a load that
        fails leaves no directory behind.
        """
        self._check_explicit()
        check_model_name(name)
        # Decoding megabytes of base64 and JSON is kept off the loop.
        overrides = await asyncio.to_thread(parse_overrides, name, parameters)
        self._scan()
        keys = self._keys_for(name)
        if len(keys) > 1 and (overrides.config is not None or overrides.files):
            raise _ambiguous_error(name, len(keys))
        for key in keys:
            await self._load_one(key, overrides)

    async def _load_one(self, name: str, overrides: LoadOverrides) -> None:
        try:
            async with self._locks.hold(name):
                holder = await self._write_overrides(name, overrides)
                model_dir = (holder.model_dir if holder is not None
                             else self._repository_dir(name))
                try:
                    await self._install(name, model_dir, overrides, holder, _OnFailure.RAISE)
                finally:
                    if name in self.models:
                        self.models[name].explicit = True
                    if holder is not None and not self._holds(name, holder):
                        holder.remove()
        finally:
            await self._settle()

    async def unload(self, name: str, parameters: Mapping[str, Any]) -> None:
        """Take ``name`` out of service at once; its admitted requests drain meanwhile."""
        self._check_explicit()
        check_model_name(name)
        for key in self._keys_for(name):
            async with self._locks.hold(key):
                self._retire_entry(key)
            # Triton's name for it: the models this one depends on (an ensemble's
            # composing models) are unloaded too, unless loaded on their own or used by
            # another.
            if parameters.get("unload_dependents") is True:
                await self._unload_composing(key)
        await self._settle()

    async def sync_with_repository(self) -> None:
        """Poll mode: load added models, unload removed ones, reload changed ones."""
        found, broken = self._scan()
        for name in sorted(self.models.keys() - found.keys()):
            if self._serving(name):
                log.info("model '%s' was removed from the repository: unloading", name)
                async with self._locks.hold(name):
                    self._retire_entry(name)
            elif not any(s.model is not None for s in self.models[name].versions.values()):
                # A failed (or unloaded) model that is gone: nothing is meant to serve it,
                # so it no longer holds strict readiness down.
                del self.models[name]
        for name, model_dir in sorted(found.items()):
            entry = self.models.get(name)
            if entry is not None and entry.fingerprint == fingerprint(model_dir):
                continue
            log.info("model '%s' %s: loading", name, "is new" if entry is None else "changed")
            async with self._locks.hold(name):
                await self._install(name, model_dir)
        for name, reason in broken.items():
            if not self._serving(name):
                self.models[name] = ModelEntry(name, None, reason=reason)
        await self._settle()

    def _check_explicit(self) -> None:
        if self.control_mode is not ControlMode.EXPLICIT:
            raise TritiumError(
                ErrorCode.UNAVAILABLE,
                "explicit model load / unload is not allowed unless the server runs with "
                "--model-control-mode=explicit",
            )

    def _serving(self, name: str) -> bool:
        entry = self.models.get(name)
        return entry is not None and any(
            s.state is ModelState.READY for s in entry.versions.values())

    @staticmethod
    async def _write_overrides(name: str, overrides: LoadOverrides) -> OverrideDir | None:
        if not overrides.files:
            return None
        try:
            return await asyncio.to_thread(OverrideDir.write, name, overrides.files)
        except OSError as exc:
            raise TritiumError(
                ErrorCode.INTERNAL,
                f"failed to load '{name}': cannot write its override files: {exc.strerror}",
            ) from None

    def _holds(self, name: str, holder: OverrideDir) -> bool:
        entry = self.models.get(name)
        return entry is not None and entry.override_dir is holder

    def _repository_dir(self, name: str) -> Path:
        found, broken = self._scan()
        if name in broken:
            raise TritiumError(ErrorCode.INVALID_ARG, f"failed to load '{name}': {broken[name]}")
        if name not in found:
            raise TritiumError(
                ErrorCode.INVALID_ARG,
                f"failed to load '{name}': no model directory named '{name}' in the "
                "model repository",
            )
        return found[name]

    async def _install(
        self,
        name: str,
        model_dir: Path,
        overrides: LoadOverrides | None = None,
        holder: OverrideDir | None = None,
        on_failure: _OnFailure = _OnFailure.RECORD,
        chain: tuple[str, ...] = (),
    ) -> None:
        """Start every version ``model_dir`` selects, then swap them in all at once.

        A model that is serving keeps serving, unchanged, if any new version fails.
        """
        stamp = fingerprint(model_dir)
        try:
            prepared = await asyncio.to_thread(self._prepare_config, model_dir, overrides)
        except TritiumError as exc:
            if on_failure is _OnFailure.RAISE:
                # As Triton's poll step: a config refused before any model code runs
                # changes no model's state, so the server's readiness stays as it was.
                log.error("model '%s' failed to load: %s", name, exc.message)
                raise TritiumError(ErrorCode.INVALID_ARG,
                                   f"failed to load '{name}': {exc.message}") from None
            entry = self.models.setdefault(name, ModelEntry(name, model_dir))
            self._install_failed(entry, holder, stamp, exc.message, on_failure)
            return
        entry = self.models.setdefault(name, ModelEntry(name, model_dir))
        entry.refused = False
        try:
            config = await asyncio.to_thread(finish_model_config, model_dir, prepared,
                                             self.auto_complete)
            versions = available_versions(model_dir, config)
        except TritiumError as exc:
            self._config_failed(entry, holder, stamp, exc.message, on_failure)
            return
        if is_ensemble(config):
            entry.ensemble_config, entry.ensemble_versions = config, tuple(versions)
            try:
                config = await self._prepare_ensemble(entry, config, chain)
            except TritiumError as exc:
                self._config_failed(entry, holder, stamp, exc.message, on_failure)
                return
        started = await self._start_versions(entry, model_dir, versions, config)
        failures = {v: r for v, r in started.items() if isinstance(r, str)}
        models = {v: r for v, r in started.items() if not isinstance(r, str)}
        if failures and self._serving(name):
            for model in models.values():
                await self._stop(model)
            self._forget_loading(entry)
            detail = "; ".join(f"version {v}: {r}" for v, r in sorted(failures.items()))
            self._install_failed(entry, holder, stamp, detail, on_failure)
            return
        self._swap(entry, model_dir, models, failures, holder)
        entry.fingerprint = stamp
        if failures and on_failure is _OnFailure.RAISE:
            detail = "; ".join(f"version {v}: {r}" for v, r in sorted(failures.items()))
            raise TritiumError(ErrorCode.INVALID_ARG, f"failed to load '{name}': {detail}")

    def _prepare_config(self, model_dir: Path, overrides: LoadOverrides | None
                        ) -> PreparedConfig:
        # Names from the repository's directories too: the python backend's rule holds.
        check_model_name(model_dir.name)
        if overrides is not None and overrides.config is not None:
            return PreparedConfig(prepare_model_config(model_dir, overrides.config))
        return read_model_config(model_dir, self.auto_complete is not None, self.config_name)

    async def _start_versions(self, entry: ModelEntry, model_dir: Path, versions: list[int],
                              config: Any) -> dict[int, ServedVersion | str]:
        for version in versions:
            if version not in entry.versions or entry.versions[version].model is None:
                entry.versions[version] = VersionEntry(ModelState.LOADING)
        results = await asyncio.gather(
            *(self._start_version(entry.name, model_dir, v, config) for v in versions))
        return dict(zip(versions, results, strict=True))

    async def _start_version(self, name: str, model_dir: Path, version: int, config: Any
                             ) -> ServedVersion | str:
        """The started version, or why it failed after ``load_retries`` more tries."""
        for attempt in range(self.load_retries + 1):
            try:
                model = self._new_version(model_dir, version, config)
                if self.namespacing:
                    model.namespace = self._namespace_of(name, model_dir)
                await self._start_in_slot(model)
            except Exception as exc:
                reason = _reason(exc)
                if attempt < self.load_retries:
                    log.warning("model '%s' version %d failed to load (try %d of %d): %s",
                                name, version, attempt + 1, self.load_retries + 1, reason)
                    continue
                log.error("model '%s' version %d failed to load: %s", name, version, reason)
                return reason
            return model
        raise AssertionError("unreachable: the last try returns")

    def _namespace_of(self, key: str, model_dir: Path) -> str:
        """Triton's namespace of a model: the repository it was found in."""
        if NAMESPACE_SEPARATOR in key:
            return key.partition(NAMESPACE_SEPARATOR)[2]
        for repository in self.repositories:
            if model_dir.parent == repository or (repository / key).is_dir():
                return str(repository)
        return ""

    async def _start_in_slot(self, model: ServedVersion) -> None:
        if self._load_slots is None:
            await model.start(self.loop, self.instances)
            return
        async with self._load_slots:
            await model.start(self.loop, self.instances)

    def _new_version(self, model_dir: Path, version: int, config: Any) -> ServedVersion:
        model: ServedVersion
        if not is_ensemble(config):
            model = LoadedModel(model_dir, version, config, self.response_cache,
                                self.rate_limiter)
        elif self.create_ensemble is None:
            raise TritiumError(ErrorCode.UNSUPPORTED, "ensembles are not available here")
        else:
            model = self.create_ensemble(EnsemblePlan.from_config(config), config, version)
        if self.instrument is not None:
            self.instrument(model)
        return model

    def _swap(self, entry: ModelEntry, model_dir: Path, models: dict[int, ServedVersion],
              failures: dict[int, str], holder: OverrideDir | None) -> None:
        entry.latest = None  # versions become READY (or are replaced) below
        # Only versions that run keep the directory they run from.
        old_holder, entry.override_dir = entry.override_dir, holder if models else None
        if old_holder is holder:
            old_holder = None  # re-installed from the directory it already runs from
        entry.model_dir, entry.reason = model_dir, ""
        if models:
            self._installs += 1
            entry.installed_at, entry.awaiting = self._installs, False
        retired: list[tuple[ServedVersion, VersionEntry | None]] = []
        for version, slot in list(entry.versions.items()):
            if version in models or version in failures:
                continue
            if slot.state is ModelState.READY and slot.model is not None:
                retired.append((slot.model, slot))  # a version the new selection drops
                slot.state = ModelState.UNLOADING
            elif slot.model is None:
                del entry.versions[version]
        for version, model in models.items():
            slot = entry.versions[version]
            if slot.state is ModelState.READY and slot.model is not None:
                retired.append((slot.model, None))  # replaced: drains without its slot
            slot.state, slot.reason, slot.model = ModelState.READY, "", model
            log.info("model '%s' version %d is READY", entry.name, version)
        for version, reason in failures.items():
            entry.versions[version] = VersionEntry(ModelState.UNAVAILABLE, reason)
        self._retire(retired, old_holder)

    def _config_failed(self, entry: ModelEntry, holder: OverrideDir | None,
                       stamp: tuple[Any, ...], reason: str, on_failure: _OnFailure) -> None:
        """A load refused from its configs (auto-complete, an ensemble's plan or steps).

        The index shows it UNAVAILABLE with its reason, as Triton's does; asked for through
        the load API it is only refused, as a config refused earlier is, and readiness stays
        as it was (a composing model that failed to start records its own failure). Found
        by a poll or at startup, it is a failed model.
        """
        entry.refused = on_failure is _OnFailure.RAISE
        self._install_failed(entry, holder, stamp, reason, on_failure)

    def _install_failed(self, entry: ModelEntry, holder: OverrideDir | None,
                        stamp: tuple[Any, ...], reason: str, on_failure: _OnFailure) -> None:
        if holder is not None:
            holder.remove()
        # Remember the attempt, so polling does not retry an unchanged broken model.
        entry.fingerprint = stamp
        if self._serving(entry.name):
            log.error("model '%s' failed to reload, the loaded version(s) keep serving: %s",
                      entry.name, reason)
        else:
            entry.reason = reason
            for version, slot in list(entry.versions.items()):
                if slot.model is None:
                    del entry.versions[version]
            log.error("model '%s' failed to load: %s", entry.name, reason)
        if on_failure is _OnFailure.RAISE:
            raise TritiumError(ErrorCode.INVALID_ARG, f"failed to load '{entry.name}': {reason}")

    @staticmethod
    def _forget_loading(entry: ModelEntry) -> None:
        for version, slot in list(entry.versions.items()):
            if slot.state is ModelState.LOADING and slot.model is None:
                del entry.versions[version]

    # -- taking versions out of service --------------------------------------------
    def _retire_entry(self, name: str) -> None:
        entry = self.models.get(name)
        if entry is None:
            return
        retired: list[tuple[ServedVersion, VersionEntry | None]] = []
        entry.awaiting = False
        for version, slot in entry.versions.items():
            if slot.model is not None and slot.state is ModelState.READY:
                slot.state, slot.reason = ModelState.UNLOADING, ""
                log.info("model '%s' version %d is UNLOADING: %d request(s) in flight",
                         name, version, slot.model.in_flight())
                retired.append((slot.model, slot))
            elif slot.model is None and slot.state is ModelState.UNAVAILABLE:
                slot.reason = UNLOADED  # a version that failed: unloaded on purpose now
        if not entry.versions:
            entry.reason = UNLOADED
        holder, entry.override_dir = entry.override_dir, None
        entry.fingerprint = ()
        self._retire(retired, holder)

    def _retire(self, retired: list[tuple[ServedVersion, VersionEntry | None]],
                holder: OverrideDir | None) -> None:
        """Drain and stop ``retired`` in the background, then remove ``holder``."""
        if not retired and holder is None:
            return
        task = self.loop.create_task(self._drain_and_stop(retired, holder))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def wait_unloaded(self) -> None:
        """Until every version taken out of service so far has drained and stopped."""
        await asyncio.gather(*list(self._retiring), return_exceptions=True)

    async def _drain_and_stop(self, retired: list[tuple[ServedVersion, VersionEntry | None]],
                              holder: OverrideDir | None) -> None:
        await asyncio.gather(*(self._drain_one(model, slot) for model, slot in retired))
        if holder is not None:
            await asyncio.to_thread(holder.remove)

    async def _drain_one(self, model: ServedVersion, slot: VersionEntry | None) -> None:
        cancelled = await model.drain(self.unload_timeout_s)
        await self._stop(model)
        if slot is not None and slot.model is model:
            slot.state, slot.reason, slot.model = ModelState.UNAVAILABLE, UNLOADED, None
        log.info("model '%s' version %d unloaded (%d request(s) cancelled)",
                 model.name, model.version, cancelled)

    async def _stop(self, model: ServedVersion) -> None:
        try:
            async with asyncio.timeout(FINALIZE_TIMEOUT_S):
                await model.stop()
        except TimeoutError:
            log.error("model '%s' version %d did not finish finalize() within %.0f s; "
                      "leaving it behind", model.name, model.version, FINALIZE_TIMEOUT_S)

    async def shutdown(self) -> None:
        """Stop every model (``finalize`` runs on each instance); call after the drain."""
        # Versions already UNLOADING are stopped by their own retiring task.
        loaded = [v for e in self.models.values() for v in e.versions.values()
                  if v.model is not None and v.state is ModelState.READY]
        for slot in loaded:
            slot.state = ModelState.UNLOADING
        await asyncio.gather(*(self._stop(slot.model) for slot in loaded if slot.model),
                             *list(self._retiring), return_exceptions=True)
        for slot in loaded:
            slot.state, slot.reason, slot.model = ModelState.UNAVAILABLE, UNLOADED, None
        for entry in self.models.values():
            if entry.override_dir is not None:
                entry.override_dir.remove()

    def loaded_models(self) -> list[ServedVersion]:
        return [v.model for e in self.models.values() for v in e.versions.values() if v.model]

    # -- ModelRepository -----------------------------------------------------------
    def resolve(self, name: str, version: int | None) -> ServedVersion:
        entry = self.models.get(name)
        if entry is None or entry.namespaced:
            check_model_name(name)  # only here: a name that resolves needs no check
            keys = self._ambiguous.get(name)
            if keys:
                raise _ambiguous_error(name, len(keys))
            raise TritiumError(
                ErrorCode.INVALID_ARG, f"Request for unknown model: '{name}' is not found"
            )
        if version is None:  # every request's usual case, without a call: the latest
            latest = entry.latest  # version, still ready (``_version_of`` finds it again)
            if latest is not None and latest.state is _READY and latest.model is not None:
                return latest.model
        return self._version_of(entry, version)

    def resolve_member(self, key: str, version: int | None) -> ServedVersion:
        """An ensemble step's model: ``key`` may be qualified by its repository."""
        entry = self.models.get(key)
        if entry is None:
            raise TritiumError(ErrorCode.INVALID_ARG,
                               f"Request for unknown model: '{plain_name(key)}' is not found")
        return self._version_of(entry, version)

    def _version_of(self, entry: ModelEntry, version: int | None) -> ServedVersion:
        if version is None:
            latest = entry.latest
            if latest is None or latest.state is not _READY:
                latest = entry.latest = _latest_ready(entry)
            model = latest.model
            assert model is not None  # a READY slot holds its model (see _swap)
            return model
        slot = entry.versions.get(version)
        # An UNLOADING version is still reachable by number, so the frontends can finish
        # the requests it is draining; its scheduler refuses anything new.
        if slot is None or slot.model is None or slot.state not in _REACHABLE:
            raise TritiumError(
                ErrorCode.UNAVAILABLE,
                f"Request for unknown model: '{plain_name(entry.name)}' version {version} is "
                "not at ready state",
            )
        return slot.model

    def ready_versions(self, name: str) -> list[int]:
        entry = self.models.get(name)
        if entry is None:
            return []
        return sorted(v for v, s in entry.versions.items() if s.state is ModelState.READY)

    def index(self, ready_only: bool) -> list[IndexEntry]:
        rows: list[IndexEntry] = []
        for key in sorted(self.models, key=lambda key: (plain_name(key), key)):
            entry, name = self.models[key], plain_name(key)
            if not entry.versions:
                if not ready_only:
                    rows.append(IndexEntry(name, None, ModelState.UNAVAILABLE, entry.reason))
                continue
            for version in sorted(entry.versions):
                state, reason = _state_of(entry.versions[version])
                if ready_only and state is not ModelState.READY:
                    continue
                rows.append(IndexEntry(name, version, state, reason))
        return rows

    def is_ready(self) -> bool:
        """Triton's strict readiness: every model meant to serve is READY and up.

        A version loading, unloading, or failed makes the server not ready; one unloaded
        on purpose does not count; a READY version whose instance process died (and is
        restarting) is not ready until it is back. A reload keeps the serving version
        READY while the new one starts, so a reload alone never flips readiness.
        """
        if self.failed_models():
            return False
        for entry in self.models.values():
            for slot in entry.versions.values():
                if slot.state is ModelState.READY:
                    if slot.model is not None and not _up(slot.model):
                        return False  # an instance restarting, or every one given up
                elif slot.state is not ModelState.UNAVAILABLE:
                    return False  # LOADING or UNLOADING
        return True

    def failed_models(self) -> list[str]:
        """Models that should serve and failed to load (or were not found)."""
        return [name for name, entry in sorted(self.models.items()) if _failed(entry)]


def _failed(entry: ModelEntry) -> bool:
    if entry.refused:
        return False
    if not entry.versions:
        return entry.reason not in ("", UNLOADED)
    return any(slot.state is ModelState.UNAVAILABLE and slot.reason != UNLOADED
               for slot in entry.versions.values())


def _up(model: ServedVersion) -> bool:
    """Every instance of ``model`` runs (Triton asks each instance of the model)."""
    return model.is_ready() and model.instances_up()


def _latest_ready(entry: ModelEntry) -> VersionEntry:
    """The slot of ``entry``'s highest READY version; UNAVAILABLE when it has none."""
    number, latest = -1, None
    for version, slot in entry.versions.items():
        if slot.state is ModelState.READY and slot.model is not None and version > number:
            number, latest = version, slot
    if latest is None:
        raise TritiumError(
            ErrorCode.UNAVAILABLE,
            f"Request for unknown model: '{plain_name(entry.name)}' has no available versions"
            + (f": {entry.reason}" if entry.reason else ""),
        )
    return latest


def _ambiguous_error(name: str, count: int) -> TritiumError:
    """Triton's words for a name that models of several repositories have."""
    return TritiumError(ErrorCode.INVALID_ARG,
                        f"There are {count} identifiers of model '{name}' in global map, model "
                        "namespace must be provided to resolve ambiguity.")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TritiumError):
        return exc.message
    return f"{type(exc).__name__}: {exc}"


def _state_of(slot: VersionEntry) -> tuple[ModelState, str]:
    """A slot's state and reason; a READY version whose instances all gave up restarting
    is UNAVAILABLE with their reason."""
    if slot.state is ModelState.READY and slot.model is not None:
        reason = slot.model.unavailable_reason()
        if reason is not None:
            return ModelState.UNAVAILABLE, reason
    return slot.state, slot.reason
