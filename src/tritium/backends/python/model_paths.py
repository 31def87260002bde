"""The model directories on sys.path, counted by the imports that use them."""

from __future__ import annotations

import os
import sys
from collections import Counter


class ModelPaths:
    """Appends a model's directories to sys.path and takes them away after the last user.

    Triton's stub, one process per instance, appends them for the process's whole life;
    here one process serves every model, so an entry lives while some instance (or an
    auto-complete import) of a model with that directory does. Callers hold the import
    lock: sys.path and sys.modules are process-wide.
    """

    def __init__(self) -> None:
        self._users: Counter[str] = Counter()

    def use(self, directories: list[str]) -> None:
        for directory in directories:
            if self._users[directory] == 0:
                sys.path.append(directory)
            self._users[directory] += 1

    def release(self, directories: list[str]) -> None:
        gone = []
        for directory in directories:
            self._users[directory] -= 1
            if self._users[directory] <= 0:
                del self._users[directory]
                _remove_last(sys.path, directory)
                gone.append(directory)
        if gone:
            _forget_modules_under(gone)


def _remove_last(items: list[str], value: str) -> None:
    for index in range(len(items) - 1, -1, -1):
        if items[index] == value:
            del items[index]
            return


def _forget_modules_under(directories: list[str]) -> None:
    """Drop modules whose file lies in one of ``directories`` (a model's ``helper.py``),
    so that the next load of that model, or another one, imports its own copy."""
    prefixes = tuple(os.path.join(directory, "") for directory in directories)
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if isinstance(file, str) and file.startswith(prefixes):
            sys.modules.pop(name, None)
