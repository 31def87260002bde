"""Top-level imports of a model's own files resolve to that model's copy.

Triton runs each model instance in its own stub process, so ``import helper`` (or
``unittest.main("model")``, which imports ``model`` by name) finds the ``helper.py`` or
``model.py`` next to the calling model, whatever other models hold files of the same
name. Here every model shares one interpreter and one ``sys.modules``, so such an import
is redirected to a submodule of the importing instance's own package
(``_tritium_model_<n>.helper``): a copy per instance, as in Triton.

The importing model is the module that runs the import statement when that module is a
model's (its globals name the package); otherwise (a library such as unittest importing
on the model's behalf) the model whose code is running on this thread or task.
"""

from __future__ import annotations

import builtins
import importlib.machinery
import os
import sys
import threading
import types
from collections.abc import Mapping, Sequence
from typing import Any

from tritium.backends.python import scope

_lock = threading.Lock()
# package name -> the version directory it imports from
_package_dirs: dict[str, str] = {}
# version directory -> package names importing from it (newest last); tuples, replaced
# whole, so that an import on another thread reads them without the lock
_dir_packages: dict[str, tuple[str, ...]] = {}
# version directory -> the top-level module names its files provide
_dir_names: dict[str, frozenset[str]] = {}
# every such name: the one lookup an unrelated import pays
_local_names: frozenset[str] = frozenset()
# (directory, name) -> whether the model's file wins over the rest of sys.path
_wins: dict[tuple[str, str], bool] = {}
_original_import = builtins.__import__


def register(package_name: str, version_dir: str) -> None:
    """Let the modules of ``version_dir`` import each other within ``package_name``."""
    global _local_names
    with _lock:
        _package_dirs[package_name] = version_dir
        _dir_packages[version_dir] = (*_dir_packages.get(version_dir, ()), package_name)
        _dir_names[version_dir] = _module_names(version_dir)
        _local_names = frozenset().union(*_dir_names.values())
        _wins.clear()  # the files of a directory may have changed since the last load
        if builtins.__import__ is not _scoped_import:
            builtins.__import__ = _scoped_import


def unregister(package_name: str) -> None:
    global _local_names
    with _lock:
        version_dir = _package_dirs.pop(package_name, None)
        if version_dir is None:
            return
        packages = tuple(p for p in _dir_packages[version_dir] if p != package_name)
        if packages:
            _dir_packages[version_dir] = packages
        else:
            del _dir_packages[version_dir], _dir_names[version_dir]
            _local_names = frozenset().union(*_dir_names.values())


def _module_names(directory: str) -> frozenset[str]:
    # os, not pathlib: an instance process does without pathlib's imports.
    names = set()
    try:
        with os.scandir(directory) as listing:
            entries = list(listing)
    except OSError:
        entries = []
    for entry in entries:
        stem, suffix = os.path.splitext(entry.name)
        if suffix == ".py" and stem.isidentifier():
            names.add(stem)
        elif (entry.is_dir() and entry.name.isidentifier()
              and os.path.isfile(os.path.join(entry.path, "__init__.py"))):
            names.add(entry.name)
    return frozenset(names)


def _scoped_import(
    name: str,
    globals: Mapping[str, Any] | None = None,
    locals: Mapping[str, Any] | None = None,
    fromlist: Sequence[str] | None = (),
    level: int = 0,
) -> types.ModuleType:
    top = name.partition(".")[0]
    if level == 0 and top in _local_names:
        package = _importing_package(globals, top)
        if package is not None:
            module = _original_import(f"{package}.{name}", globals, locals, fromlist, 0)
            # `import a.b` binds `a`: the instance's copy of `a`, not its package.
            return module if fromlist else sys.modules[f"{package}.{top}"]
    return _original_import(name, globals, locals, fromlist, level)


def _importing_package(globals: Mapping[str, Any] | None, top: str) -> str | None:
    """The instance package whose copy of ``top`` this import should get, if any."""
    caller = globals.get("__name__") if globals is not None else None
    package = caller.partition(".")[0] if isinstance(caller, str) else ""
    version_dir = _package_dirs.get(package)
    if version_dir is None:
        current = scope.current()
        if current is None:
            return None
        version_dir = current.model_dir
        packages = _dir_packages.get(version_dir)
        if not packages:
            return None
        package = packages[-1]
    if top not in _dir_names.get(version_dir, ()) or not _model_file_wins(version_dir, top):
        return None
    return package


def _model_file_wins(version_dir: str, top: str) -> bool:
    """Whether Triton's sys.path order (the model's directories appended last) would pick
    the model's file: a builtin, installed or already imported module of that name wins."""
    key = (version_dir, top)
    found = _wins.get(key)
    if found is None:
        found = not _found_elsewhere(top)
        _wins[key] = found
    return found


def _found_elsewhere(top: str) -> bool:
    if top in sys.builtin_module_names or top in sys.stdlib_module_names:
        return True
    loaded = sys.modules.get(top)
    model_dirs = set(_dir_packages)
    if loaded is not None:
        file = getattr(loaded, "__file__", None)
        return not (isinstance(file, str) and os.path.dirname(file) in model_dirs)
    others = [entry for entry in sys.path if entry not in model_dirs]
    return importlib.machinery.PathFinder.find_spec(top, others) is not None
