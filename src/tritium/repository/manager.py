"""The set of models a server knows: their versions, states, and loading them."""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.model import IndexEntry, ModelState
from tritium.repository.config import (
    AutoComplete,
    available_versions,
    find_models,
    load_model_config,
)
from tritium.repository.loaded import BackendFactory, LoadedModel

log = logging.getLogger("tritium.repository")


class ControlMode(enum.Enum):
    NONE = "none"
    EXPLICIT = "explicit"
    POLL = "poll"


@dataclass(slots=True)
class VersionEntry:
    state: ModelState
    reason: str = ""
    model: LoadedModel | None = None


@dataclass(slots=True)
class ModelEntry:
    name: str
    model_dir: Path | None
    versions: dict[int, VersionEntry] = field(default_factory=dict)
    # A model-level failure (bad config, duplicate name) before any version exists.
    reason: str = ""


class ModelManager:
    """Implements ``tritium.core.model.ModelRepository``."""

    def __init__(
        self,
        repositories: list[Path],
        loop: asyncio.AbstractEventLoop,
        create_backend: BackendFactory,
        auto_complete: AutoComplete | None,
        control_mode: ControlMode = ControlMode.NONE,
    ):
        self.repositories = repositories
        self.loop = loop
        self.create_backend = create_backend
        self.auto_complete = auto_complete
        self.control_mode = control_mode
        self.models: dict[str, ModelEntry] = {}

    # -- loading -----------------------------------------------------------------
    async def load_startup_models(self, names: list[str]) -> None:
        """Load what the control mode says to load at startup (``*`` means all)."""
        found, broken = find_models(self.repositories)
        for name, reason in broken.items():
            self.models[name] = ModelEntry(name, None, reason=reason)
        if self.control_mode is ControlMode.EXPLICIT and "*" not in names:
            wanted = [n for n in names if n in found]
            for name in names:
                if name not in found and name not in broken:
                    self.models[name] = ModelEntry(name, None, reason="model not found")
        else:
            wanted = sorted(found)
        await asyncio.gather(*(self._load(name, found[name]) for name in wanted))

    async def _load(self, name: str, model_dir: Path) -> None:
        entry = ModelEntry(name, model_dir)
        self.models[name] = entry
        try:
            config = await asyncio.to_thread(load_model_config, model_dir, self.auto_complete)
            versions = available_versions(model_dir, config)
        except TritiumError as exc:
            entry.reason = exc.message
            log.error("model '%s' failed to load: %s", name, exc.message)
            return
        await asyncio.gather(*(self._load_version(entry, v, config) for v in versions))

    async def _load_version(self, entry: ModelEntry, version: int, config: Any) -> None:
        slot = entry.versions[version] = VersionEntry(ModelState.LOADING)
        assert entry.model_dir is not None
        try:
            model = LoadedModel(entry.model_dir, version, config)
            await model.start(self.loop, self.create_backend)
        except Exception as exc:
            slot.state, slot.reason = ModelState.UNAVAILABLE, _reason(exc)
            log.error("model '%s' version %d failed to load: %s", entry.name, version, slot.reason)
            return
        slot.state, slot.model = ModelState.READY, model

    async def shutdown(self) -> None:
        """Stop every loaded model (``finalize`` runs on each instance)."""
        loaded = [v for e in self.models.values() for v in e.versions.values() if v.model]
        for slot in loaded:
            slot.state = ModelState.UNLOADING
        await asyncio.gather(*(slot.model.stop() for slot in loaded if slot.model))
        for slot in loaded:
            slot.state, slot.reason, slot.model = ModelState.UNAVAILABLE, "unloaded", None

    def loaded_models(self) -> list[LoadedModel]:
        return [v.model for e in self.models.values() for v in e.versions.values() if v.model]

    # -- ModelRepository -----------------------------------------------------------
    def resolve(self, name: str, version: int | None) -> LoadedModel:
        entry = self.models.get(name)
        if entry is None:
            raise TritiumError(
                ErrorCode.INVALID_ARG, f"Request for unknown model: '{name}' is not found"
            )
        if version is None:
            ready = self.ready_versions(name)
            if not ready:
                raise TritiumError(
                    ErrorCode.UNAVAILABLE,
                    f"Request for unknown model: '{name}' has no available versions"
                    + (f": {entry.reason}" if entry.reason else ""),
                )
            version = ready[-1]
        slot = entry.versions.get(version)
        if slot is None or slot.model is None or slot.state is not ModelState.READY:
            raise TritiumError(
                ErrorCode.UNAVAILABLE,
                f"Request for unknown model: '{name}' version {version} is not at ready state",
            )
        return slot.model

    def ready_versions(self, name: str) -> list[int]:
        entry = self.models.get(name)
        if entry is None:
            return []
        return sorted(v for v, s in entry.versions.items() if s.state is ModelState.READY)

    def index(self, ready_only: bool) -> list[IndexEntry]:
        rows: list[IndexEntry] = []
        for name in sorted(self.models):
            entry = self.models[name]
            if not entry.versions:
                if not ready_only:
                    rows.append(IndexEntry(name, None, ModelState.UNAVAILABLE, entry.reason))
                continue
            for version in sorted(entry.versions):
                slot = entry.versions[version]
                if ready_only and slot.state is not ModelState.READY:
                    continue
                rows.append(IndexEntry(name, version, slot.state, slot.reason))
        return rows

    def is_ready(self) -> bool:
        for entry in self.models.values():
            if entry.reason and not entry.versions:
                return False
            for slot in entry.versions.values():
                if slot.state is not ModelState.READY and slot.reason != "unloaded":
                    return False
        return True

    async def load(self, name: str, parameters: Mapping[str, Any]) -> None:
        raise TritiumError(
            ErrorCode.UNAVAILABLE,
            "explicit model load / unload is not allowed unless --model-control-mode=explicit"
            if self.control_mode is not ControlMode.EXPLICIT
            else "model load / unload is not implemented yet",
        )

    async def unload(self, name: str, parameters: Mapping[str, Any]) -> None:
        await self.load(name, parameters)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TritiumError):
        return exc.message
    return f"{type(exc).__name__}: {exc}"
