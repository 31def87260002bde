"""Busy in pure Python for INPUT0[0] seconds and never asks is_cancelled(); answers its pid.

Records each start in the file named by the model parameter ``record_file`` (one JSON line:
{"event": "start", "pid": ..., "t": ...}), so a test can wait until execute() is running.
"""

import json
import os
import time

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.record_file = config["parameters"]["record_file"]["string_value"]

    def execute(self, requests):
        responses = []
        for request in requests:
            seconds = float(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0])
            with open(self.record_file, "a") as f:
                f.write(json.dumps({"event": "start", "pid": os.getpid(),
                                    "t": time.monotonic()}) + "\n")
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                pass  # works, never polls
            out = pb_utils.Tensor("OUTPUT0", np.array([os.getpid()], dtype=np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
