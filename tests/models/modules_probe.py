"""Answers which modules this process has imported: OUTPUT0 (BYTES, one JSON element)
holds the sorted names in ``sys.modules`` and the pid. Imports nothing beyond what any
model needs, so what it reports is what the instance itself brought in."""

import json
import os
import sys

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        facts = {"modules": sorted(sys.modules), "pid": os.getpid()}
        out = pb_utils.Tensor("OUTPUT0", np.array([json.dumps(facts).encode()], dtype=object))
        return [pb_utils.InferenceResponse(output_tensors=[out]) for _ in requests]
