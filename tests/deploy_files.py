"""Reads what deploy/ ships: the manifests as documents, the image's Containerfile as
instructions, and the tritonserver command lines they run, parsed by tritium's own CLI."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tritium.cli import parse_config
from tritium.config import BUNDLED_REPOSITORY, ServerConfig

DEPLOY = Path(__file__).parent.parent / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
KSERVE = DEPLOY / "kserve"
IMAGE = DEPLOY / "image"
MODEL_STORE = "/mnt/models"

Document = dict[str, Any]


def manifest_files() -> list[Path]:
    """Every Kubernetes or KServe object file (kustomization.yaml configures, it is no object)."""
    files = sorted([*KUBERNETES.glob("*.yaml"), *KSERVE.glob("*.yaml")])
    return [path for path in files if path.name != "kustomization.yaml"]


def documents(path: Path) -> list[Document]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def load_all() -> list[Document]:
    return [doc for path in manifest_files() for doc in documents(path)]


def the(kind: str, docs: list[Document] | None = None) -> Document:
    """The one object of this kind (a second one would leave the tests guessing)."""
    found = [doc for doc in (load_all() if docs is None else docs) if doc["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def all_of(kind: str) -> list[Document]:
    return [doc for doc in load_all() if doc["kind"] == kind]


def server_config(argv: list[str]) -> ServerConfig:
    """A tritonserver command line, parsed as tritium parses it.

    /mnt/models is where the image puts the bundled repository; here it is read from the
    source tree, so that the parse checks a real directory.
    """
    assert argv[0] == "tritonserver", f"not a tritonserver command line: {argv}"
    args = [arg.replace(f"={MODEL_STORE}", f"={BUNDLED_REPOSITORY}") for arg in argv[1:]]
    return parse_config(["serve", *args])


def containerfile() -> dict[str, list[str]]:
    """Instruction -> arguments of each occurrence, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (IMAGE / "Containerfile").read_text())
    instructions: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            instructions.setdefault(word.upper(), []).append(rest.strip())
    return instructions


def exec_form(text: str) -> list[str]:
    """A Containerfile JSON array (["a", "b"]) or, failing that, shell words."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return shlex.split(text)
    assert isinstance(value, list)
    return [str(item) for item in value]


def container_ports(container: Document) -> dict[str, int]:
    return {port.get("name", str(port["containerPort"])): port["containerPort"]
            for port in container.get("ports", [])}


def iter_probes(container: Document) -> Iterator[tuple[str, Document]]:
    for key in ("startupProbe", "livenessProbe", "readinessProbe"):
        if key in container:
            yield key, container[key]
