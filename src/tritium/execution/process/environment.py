"""``EXECUTION_ENV_PATH``: a model's own Python environment, as Triton's python backend reads it.

The parameter names a directory holding a Python environment (a venv, a conda env) or a
tar archive of one (``conda-pack``'s ``.tar.gz``, or ``tar czf`` of a venv). As in Triton,
the first ``$$TRITON_MODEL_DIRECTORY`` in it becomes the model's directory, and a path that
does not exist is refused. An archive is extracted once into a private cache directory
named after its content (sha256), so restarts and servers that load the same archive
share one copy, and a changed archive gets a new one.

The instance process runs that environment's interpreter. Its own packages come first on
``sys.path``; tritium itself (and what tritium needs that the environment lacks) is found
after them, in the server's own package directories. The environment must provide
numpy, checked here once per interpreter with the environment's own paths only.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import site
import subprocess
import sys
import tarfile
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tritium
from tritium.core.errors import ErrorCode, TritiumError

PARAMETER = "EXECUTION_ENV_PATH"
MODEL_DIRECTORY_KEYWORD = "$$TRITON_MODEL_DIRECTORY"
CACHE_ENV = "TRITIUM_EXECUTION_ENV_CACHE"
# The server's package directories, handed to the child's bootstrap through its environment.
SERVER_PATH_ENV = "TRITIUM_SERVER_PATH"
INTERPRETERS = ("bin/python3", "bin/python")
PROBE_TIMEOUT_S = 60.0

# Run by the environment's interpreter as ``python -c BOOTSTRAP <module> <args>``: what
# ``python -m <module> <args>`` does, with the server's package directories after the
# environment's own (site.addsitedir also reads their .pth files: editable installs).
BOOTSTRAP = (
    "import os, runpy, site, sys\n"
    f"for d in os.environ.pop({SERVER_PATH_ENV!r}, '').split(os.pathsep):\n"
    "    d and site.addsitedir(d)\n"
    "module = sys.argv.pop(1)\n"
    "runpy.run_module(module, run_name='__main__', alter_sys=True)\n"
)

# Checks, in the environment's interpreter: numpy from the environment itself, then the
# server's packages importable after it.
_PROBE = (
    "import json, os, site, sys\n"
    "info = {'python': '%d.%d' % sys.version_info[:2]}\n"
    "try:\n"
    "    import numpy\n"
    "    info['numpy'] = numpy.__version__\n"
    "except Exception as exc:\n"
    "    info['numpy_error'] = '%s: %s' % (type(exc).__name__, exc)\n"
    "for d in sys.argv[1].split(os.pathsep):\n"
    "    d and site.addsitedir(d)\n"
    "try:\n"
    "    import tritium.backends.python.loader\n"
    "except Exception as exc:\n"
    "    info['tritium_error'] = '%s: %s' % (type(exc).__name__, exc)\n"
    "print(json.dumps(info))\n"
)


@dataclass(frozen=True, slots=True)
class ExecutionEnvironment:
    """A resolved environment: where it lies and the interpreter an instance runs."""

    configured: str  # the parameter's value, with the model directory expanded
    root: Path  # the environment's directory (the extracted copy, for an archive)
    interpreter: Path
    python: str  # "3.11"
    numpy: str

    def command(self, module: str, args: list[str]) -> list[str]:
        """The argv that runs ``python -m module args`` in this environment."""
        return [str(self.interpreter), "-c", BOOTSTRAP, module, *args]

    def spawn_env(self, base: Mapping[str, str]) -> dict[str, str]:
        """The child's environment variables: the environment activated, as its
        ``bin/activate`` would, plus its ``lib`` for shared libraries (Triton adds it too)."""
        env = {key: value for key, value in base.items()
               if key not in ("PYTHONHOME", "PYTHONPATH", "VIRTUAL_ENV")}
        env["VIRTUAL_ENV"] = str(self.root)
        env["PATH"] = os.pathsep.join(filter(None, [str(self.root / "bin"), base.get("PATH")]))
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            filter(None, [str(self.root / "lib"), base.get("LD_LIBRARY_PATH")]))
        env[SERVER_PATH_ENV] = server_path(base)
        return env


def configured_path(config: Any, model_dir: str) -> str | None:
    """The model's ``EXECUTION_ENV_PATH`` with the model directory expanded; None if unset."""
    parameter = config.parameters.get(PARAMETER) if config.parameters else None
    if parameter is None or not parameter.string_value:
        return None
    return expand_model_directory(parameter.string_value, model_dir)


def expand_model_directory(value: str, model_dir: str) -> str:
    """Triton replaces the first ``$$TRITON_MODEL_DIRECTORY`` only (and, where it is not at
    the start, a few characters after it too: std::string::replace is given an end where it
    takes a count; not copied)."""
    return value.replace(MODEL_DIRECTORY_KEYWORD, model_dir, 1)


def resolve(config: Any, model_dir: str, cache_root: Path | None = None
            ) -> ExecutionEnvironment | None:
    """The model's environment, extracted and checked; None when it names none.

    Blocking (hashing, extracting, one probe of the interpreter): call off the event loop.
    """
    configured = configured_path(config, model_dir)
    if configured is None:
        return None
    where = f"{PARAMETER} '{configured}' of model '{config.name}'"
    root = _environment_root(configured, where, cache_root)
    interpreter = find_interpreter(root, where)
    facts = probe(interpreter)
    if "numpy" not in facts:
        raise TritiumError(ErrorCode.INVALID_ARG, (
            f"{where}: its Python ({interpreter}) cannot import numpy "
            f"({facts.get('numpy_error', 'not found')}); the environment must contain numpy"))
    if "tritium_error" in facts:
        raise TritiumError(ErrorCode.INVALID_ARG, (
            f"{where}: its Python {facts['python']} cannot run tritium's instance process "
            f"({facts['tritium_error']}); use Python {_server_python()} or install tritium's "
            "dependencies into the environment"))
    return ExecutionEnvironment(configured, root, interpreter, facts["python"], facts["numpy"])


def _environment_root(configured: str, where: str, cache_root: Path | None) -> Path:
    try:
        path = Path(configured).resolve(strict=True)
    except (OSError, RuntimeError):
        # Triton's words for a path that does not resolve.
        raise TritiumError(ErrorCode.INVALID_ARG,
                           f"Failed to get the canonical path for {configured}.") from None
    if path.is_dir():
        return path
    if not tarfile.is_tarfile(path):
        raise TritiumError(ErrorCode.INVALID_ARG,
                           f"{where} is neither a directory nor a tar archive")
    return extract(path, cache_root or default_cache_root())


def find_interpreter(root: Path, where: str) -> Path:
    """``bin/python3`` or ``bin/python`` of ``root``, or of the one directory an archive
    wrapped the environment in."""
    candidates = [root]
    entries = [entry for entry in root.iterdir() if entry.is_dir()] if root.is_dir() else []
    if not (root / "bin").is_dir() and len(entries) == 1:
        candidates.append(entries[0])
    for base in candidates:
        for name in INTERPRETERS:
            interpreter = base / name
            if interpreter.is_file() and os.access(interpreter, os.X_OK):
                return interpreter
    raise TritiumError(ErrorCode.INVALID_ARG, (
        f"{where}: no Python interpreter in it ({' or '.join(INTERPRETERS)} under {root}); "
        "it must be a Python environment such as a venv or a conda-pack archive"))


# -- archives ----------------------------------------------------------------------------
_digests: dict[tuple[str, int, int, int], str] = {}
_extract_lock = threading.Lock()


def default_cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tritium" / "execution_envs"


def extract(archive: Path, cache_root: Path) -> Path:
    """The directory ``archive`` is extracted into, ``<cache>/<sha256 prefix>``; extracted
    into a temporary directory first and renamed, so a half-extracted copy is never used."""
    with _extract_lock:
        cache = _private_dir(cache_root)
        target = cache / content_digest(archive)[:32]
        if target.is_dir():
            return target
        staging = Path(tempfile.mkdtemp(prefix=".extracting-", dir=cache))
        try:
            with tarfile.open(archive, "r:*") as tar:
                # The "tar" filter refuses members outside the target (absolute, "..", or
                # written through a link), as Triton's libarchive flags do, and keeps the
                # absolute symlinks a venv's bin/python is.
                tar.extractall(staging, filter="tar")
            os.rename(staging, target)
        except FileExistsError:
            pass  # another server extracted it first: same content, same name
        except (OSError, tarfile.TarError) as exc:
            raise TritiumError(ErrorCode.INVALID_ARG,
                               f"cannot extract {PARAMETER} archive '{archive}': {exc}") from None
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        return target


def content_digest(path: Path) -> str:
    """sha256 of the file, remembered per (path, size, mtime, inode) in this process."""
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns, stat.st_ino)
    digest = _digests.get(key)
    if digest is None:
        hasher = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                hasher.update(chunk)
        digest = _digests[key] = hasher.hexdigest()
    return digest


def _private_dir(path: Path) -> Path:
    """``path``, created 0700; refused when someone else could write into it (they could
    swap the interpreter every model of this server would run)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    stat = path.stat()
    if stat.st_uid != os.getuid() or stat.st_mode & 0o022:
        raise TritiumError(ErrorCode.INVALID_ARG, (
            f"the {PARAMETER} cache directory '{path}' is writable by others or not ours; "
            f"set {CACHE_ENV} to a private directory"))
    return path


# -- the interpreter ---------------------------------------------------------------------
_probes: dict[tuple[str, int], dict[str, str]] = {}


def probe(interpreter: Path) -> dict[str, str]:
    """What the interpreter has (its version, numpy's), remembered per interpreter."""
    key = (str(interpreter), interpreter.stat().st_mtime_ns)
    facts = _probes.get(key)
    if facts is not None:
        return facts
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "PYTHONPATH")}
    try:
        done = subprocess.run(
            [str(interpreter), "-c", _PROBE, server_path(os.environ)], env=env,
            capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False)
        facts = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        detail = getattr(exc, "stderr", None) or exc
        raise TritiumError(ErrorCode.INVALID_ARG,
                           f"the Python interpreter {interpreter} does not run: {detail}") from None
    _probes[key] = facts
    return facts


def server_path(base: Mapping[str, str]) -> str:
    """The server's package directories: where tritium and its dependencies are found."""
    dirs = [str(Path(tritium.__file__).resolve().parent.parent)]
    dirs += [d for d in base.get("PYTHONPATH", "").split(os.pathsep) if d]
    dirs += site.getsitepackages()
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return os.pathsep.join(dict.fromkeys(dirs))


def _server_python() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"
