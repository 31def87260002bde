"""Finds the model directories in one or more model repositories."""

from __future__ import annotations

from pathlib import Path

from tritium.core.names import qualified
from tritium.repository.validation import ConfigError

DUPLICATE_REASON = "model appears in two or more repositories"


def find_models(repositories: list[Path], namespacing: bool = False
                ) -> tuple[dict[str, Path], dict[str, str]]:
    """(model key → model directory, model name → why it cannot load), keys sorted.

    A model's key is its name, unless ``namespacing`` lets its name be in two repositories:
    then each is ``qualified`` by its repository. Without it such a name cannot load, but
    the rest of both repositories still can. A repository that is missing, unreadable or
    not a directory raises ConfigError: the server cannot start without it.
    """
    found: dict[str, list[Path]] = {}
    for repository in repositories:
        for model_dir in _model_dirs(repository):
            found.setdefault(model_dir.name, []).append(model_dir)
    models: dict[str, Path] = {}
    reasons: dict[str, str] = {}
    for name in sorted(found):
        dirs = found[name]
        if len(dirs) == 1:
            models[name] = dirs[0]
        elif namespacing:
            for model_dir in dirs:
                models[qualified(name, str(model_dir.parent))] = model_dir
        else:
            reasons[name] = DUPLICATE_REASON
    return models, reasons


def _model_dirs(repository: Path) -> list[Path]:
    if not repository.is_dir():
        what = "does not exist" if not repository.exists() else "is not a directory"
        raise ConfigError(f"model repository path '{repository}' {what}")
    try:
        entries = list(repository.iterdir())
    except OSError as exc:
        raise ConfigError(f"unable to read model repository '{repository}': {exc}") from exc
    # Hidden entries (.git, .ipynb_checkpoints) and plain files are never models.
    return [e for e in entries if not e.name.startswith(".") and e.is_dir()]
