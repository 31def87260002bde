"""deploy/'s manifests against the API schemas: Kubernetes' own for built-in kinds, KServe's
CRD schemas for its kinds, the kustomize build included. No cluster needed."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.deploy_files import KUBERNETES, Document, all_of, documents, manifest_files

# The oldest release the manifests promise to work with (appProtocol kubernetes.io/h2c,
# autoscaling/v2 and policy/v1 are all older).
KUBERNETES_VERSION = "1.29.0"
KSERVE_SCHEMAS = Path(__file__).parent.parent / "data" / "kserve"
KSERVE_KINDS = {
    ("serving.kserve.io/v1alpha1", "ClusterServingRuntime"): "clusterservingruntime",
    ("serving.kserve.io/v1beta1", "InferenceService"): "inferenceservice",
}


def _strict(node: Any) -> Any:
    """The API server's strict field validation, in JSON Schema: an object schema that lists
    its properties admits no others (unless it keeps unknown fields on purpose)."""
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    strict = {key: _strict(value) for key, value in node.items()}
    if ("properties" in strict and "additionalProperties" not in strict
            and not strict.get("x-kubernetes-preserve-unknown-fields")):
        strict["additionalProperties"] = False
    return strict


@cache
def _kserve_validator(name: str) -> jsonschema.Draft7Validator:
    schema = json.loads((KSERVE_SCHEMAS / f"{name}.schema.json").read_text())
    return jsonschema.Draft7Validator(_strict(schema))


def validate(doc: Document) -> None:
    """Raises if the object is not valid for its kind."""
    kserve = KSERVE_KINDS.get((doc["apiVersion"], doc["kind"]))
    if kserve is not None:
        # metadata is the API server's, not the CRD's: the schema says only "object".
        _kserve_validator(kserve).validate(doc)
    else:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def _kustomize_build() -> list[Document]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with its built-in kustomize) is not installed")
    built = subprocess.run([kubectl, "kustomize", str(KUBERNETES)], check=True,
                           capture_output=True, text=True, timeout=60).stdout
    return [doc for doc in yaml.safe_load_all(built) if doc is not None]


@pytest.mark.parametrize("path", manifest_files(), ids=lambda path: path.name)
def test_every_manifest_is_valid_for_its_kind(path: Path) -> None:
    docs = documents(path)
    assert docs, f"{path} holds no object"
    for doc in docs:
        validate(doc)


def test_the_kustomize_build_is_valid() -> None:
    built = _kustomize_build()
    assert {doc["kind"] for doc in built} == {
        "Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler"}
    for doc in built:
        validate(doc)


def test_the_kustomize_build_sets_the_image() -> None:
    (deployment,) = [doc for doc in _kustomize_build() if doc["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "localhost/tritium:latest"


@pytest.mark.parametrize(("kind", "path", "wrong", "error"), [
    ("Deployment", ("spec", "template", "spec", "terminationGracePeriod"), 45, "unexpected"),
    ("ClusterServingRuntime", ("spec", "protocolVersion"), ["v2"], "unexpected"),
    ("InferenceService", ("spec", "predictor", "model", "runtimeName"), "x", "unexpected"),
    ("ClusterServingRuntime", ("spec", "containers"), "kserve-container", "not of type"),
    ("ClusterServingRuntime", ("spec", "containers", 0, "resources", "limits", "cpu"), "lots",
     "does not match"),
])
def test_a_misspelt_or_mistyped_field_is_caught(kind: str, path: tuple[str | int, ...],
                                               wrong: object, error: str) -> None:
    """The validation itself can fail: a field KServe or Kubernetes does not know, or a value
    of the wrong shape, is an error, as under the API server's strict field validation."""
    broken = copy.deepcopy(all_of(kind)[0])
    node: Any = broken
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = wrong
    with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError),
                       match=error):
        validate(broken)
