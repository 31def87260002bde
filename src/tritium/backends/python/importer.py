"""Imports model files under unique module names, and forgets them again."""

from __future__ import annotations

import importlib.util
import itertools
import os
import sys
import threading
import types

from tritium.backends.python import model_argv, model_imports
from tritium.backends.python.errors import describe_exception
from tritium.backends.python.model_paths import ModelPaths
from tritium.core.errors import ErrorCode, TritiumError

# Paths are handled with os.path: pathlib (with urllib and ipaddress) would cost each
# instance process ~0.7 MiB.
# sys.path and sys.modules are process-wide: one import at a time. Reentrant because a
# failed import forgets its module while still holding it.
_import_lock = threading.RLock()
_module_ids = itertools.count()
_model_paths = ModelPaths()


def import_model_file(path: str | os.PathLike[str]) -> types.ModuleType:
    """Import ``path`` as ``<unique package>.<stem>``.

    The package's ``__path__`` is the version directory, so ``from . import helper``
    works as it does in Triton (which imports ``<version>.model``). Like Triton's stub,
    the version and model directories are appended to sys.path and stay there while the
    module lives, so ``import helper`` also works later, inside ``execute``.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise TritiumError(ErrorCode.INVALID_ARG, f"Python model file not found in '{path}'")
    package_name = f"_tritium_model_{next(_module_ids)}"
    package = types.ModuleType(package_name)
    version_dir = os.path.dirname(path)
    package.__path__ = [version_dir]
    stem = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(f"{package_name}.{stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with _import_lock:
        model_argv.install()
        sys.modules[package_name] = package
        sys.modules[spec.name] = module
        _model_paths.use(_search_dirs(path))
        model_imports.register(package_name, version_dir)
        try:
            spec.loader.exec_module(module)
        except BaseException as exc:
            forget_module(module)
            raise TritiumError(
                ErrorCode.INVALID_ARG, f"failed to load '{path}': {describe_exception(exc)}"
            ) from exc
    return module


def forget_module(module: types.ModuleType) -> None:
    """Drop an imported model file, and whatever it imported relatively, from sys.modules.

    Its directories leave sys.path once no other live import uses them, and with them
    the top-level modules imported from there (a ``helper.py``): a reloaded model reads
    its files afresh, as a new Triton stub would.
    """
    package_name = module.__name__.partition(".")[0]
    with _import_lock:
        for name in [n for n in sys.modules if n.partition(".")[0] == package_name]:
            del sys.modules[name]
        model_imports.unregister(package_name)
        if module.__file__ is not None:
            _model_paths.release(_search_dirs(module.__file__))


def _search_dirs(path: str) -> list[str]:
    # Triton's stub appends the version directory, then the model directory.
    version_dir = os.path.dirname(path)
    return [version_dir, os.path.dirname(version_dir)]
