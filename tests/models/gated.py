"""Holds its initialize (and, when asked, its finalize) until a gate file exists, so a test
can look at the server while a model is LOADING or UNLOADING; answers INPUT0 as OUTPUT0.

Config parameters: ``gate`` (a path prefix: initialize waits for "<gate>.init", finalize
for "<gate>.finalize" when ``gate_finalize`` is "true") and ``fail`` ("true": initialize
raises once its gate opens).
"""

import json
import os
import time

import triton_python_backend_utils as pb_utils

WAIT_S = 60.0


def _wait_for(path):
    deadline = time.monotonic() + WAIT_S
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)


def _parameter(config, key, default=""):
    return config["parameters"].get(key, {}).get("string_value", default)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.gate = _parameter(config, "gate")
        self.gate_finalize = _parameter(config, "gate_finalize") == "true"
        _wait_for(self.gate + ".init")
        if _parameter(config, "fail") == "true":
            raise RuntimeError("initialize fails on purpose")

    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]

    def finalize(self):
        if self.gate_finalize:
            _wait_for(self.gate + ".finalize")
