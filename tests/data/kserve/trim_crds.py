"""Writes the KServe CRD schemas the deploy tests validate against, from KServe's CRD files.

    python tests/data/kserve/trim_crds.py <kserve checkout>/config/crd/full

Keeps each kind's openAPIV3Schema as KServe publishes it, except subtrees our manifests never
use (other predictors' frameworks, explainer, transformer, canary, status), which become
"any object" to keep the data small.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).parent
ANY_OBJECT = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
PREDICTOR_KEPT = {"model", "containers"}
FRAMEWORKS = {"huggingface", "lightgbm", "onnx", "paddle", "pmml", "pytorch", "sklearn",
              "tensorflow", "triton", "xgboost", "workerSpec"}


def _schema(crd_file: Path, version: str) -> dict[str, Any]:
    crd = yaml.safe_load(crd_file.read_text())
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version:
            schema: dict[str, Any] = entry["schema"]["openAPIV3Schema"]
            return schema
    raise SystemExit(f"{crd_file}: no version {version}")


def _trim_inference_service(schema: dict[str, Any]) -> None:
    schema["properties"]["status"] = ANY_OBJECT
    spec = schema["properties"]["spec"]["properties"]
    for component in ("canary", "explainer", "transformer"):
        if component in spec:
            spec[component] = ANY_OBJECT
    predictor = spec["predictor"]["properties"]
    for name in FRAMEWORKS - PREDICTOR_KEPT:
        if name in predictor:
            predictor[name] = ANY_OBJECT


def main(crd_dir: Path) -> None:
    runtime = _schema(crd_dir / "serving.kserve.io_clusterservingruntimes.yaml", "v1alpha1")
    runtime["properties"]["status"] = ANY_OBJECT
    service = _schema(crd_dir / "serving.kserve.io_inferenceservices.yaml", "v1beta1")
    _trim_inference_service(service)
    for name, schema in (("clusterservingruntime", runtime), ("inferenceservice", service)):
        text = json.dumps(schema, indent=None, separators=(",", ":"), sort_keys=True)
        (HERE / f"{name}.schema.json").write_text(text + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
