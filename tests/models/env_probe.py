"""Answers what this process is: OUTPUT0 (BYTES, one JSON element) holds sys.executable,
sys.argv, sys.prefix, the version and file of the package named by the model parameter
``package`` (importlib.metadata, so the first distribution on sys.path wins), numpy's
version, whether the model's directories are on sys.path, the pid and the cores this
thread may run on."""

import importlib
import importlib.metadata
import json
import os
import sys

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.package = config["parameters"]["package"]["string_value"]
        self.dirs = [os.path.join(args["model_repository"], args["model_version"]),
                     args["model_repository"]]

    def execute(self, requests):
        module = importlib.import_module(self.package)
        facts = {
            "executable": sys.executable, "argv": sys.argv, "prefix": sys.prefix,
            "version": importlib.metadata.version(self.package),
            "file": module.__file__, "numpy": np.__version__,
            "dirs_on_path": [d in sys.path for d in self.dirs], "pid": os.getpid(),
            "cores": sorted(os.sched_getaffinity(0)),
        }
        out = pb_utils.Tensor("OUTPUT0", np.array([json.dumps(facts).encode()], dtype=object))
        return [pb_utils.InferenceResponse(output_tensors=[out]) for _ in requests]
