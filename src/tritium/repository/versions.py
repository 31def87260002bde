"""Which version directories of a model exist and which its version policy selects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tritium.repository.validation import ConfigError


def version_dirs(model_dir: Path) -> dict[int, Path]:
    """Every version directory of a model, by version number.

    Triton ignores directory names that are not integers or that carry a leading zero
    ("01"), so "1" and "01" can never both claim version 1.
    """
    try:
        entries = list(model_dir.iterdir())
    except OSError as exc:
        raise ConfigError(f"unable to read model directory '{model_dir}': {exc}") from exc
    found: dict[int, Path] = {}
    for entry in entries:
        version = _version_number(entry.name)
        if version is not None and entry.is_dir():
            found[version] = entry
    return found


def available_versions(model_dir: Path, config: Any) -> list[int]:
    """The versions to load, ascending, as ``config.version_policy`` selects them.

    Raises ConfigError when the policy selects none; a ``specific`` version without a
    directory is skipped, as Triton does.
    """
    present = sorted(version_dirs(model_dir))
    policy = config.version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "specific":
        wanted = set(policy.specific.versions)
        selected = [v for v in present if v in wanted]
    elif choice == "all":
        selected = present
    else:
        # An unset policy means "latest 1", which normalisation writes explicitly.
        count = policy.latest.num_versions if choice == "latest" else 1
        selected = present[len(present) - count :] if count > 0 else []
    if not selected:
        raise ConfigError(
            "at least one version must be available under the version policy of "
            f"model '{config.name or model_dir.name}'"
        )
    return selected


def _version_number(name: str) -> int | None:
    if not name.isascii() or not name.isdigit():
        return None
    if len(name) > 1 and name.startswith("0"):
        return None
    return int(name)
