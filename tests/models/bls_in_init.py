"""Calls another model with BLS from initialize(), which Triton refuses (the load fails)."""

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        request = pb_utils.InferenceRequest(
            model_name="ctl_target",
            inputs=[pb_utils.Tensor("INPUT0", np.array([1.0], dtype=np.float32))],
            requested_output_names=["OUTPUT0"],
        )
        request.exec()

    def execute(self, requests):
        return [pb_utils.InferenceResponse([]) for _ in requests]
