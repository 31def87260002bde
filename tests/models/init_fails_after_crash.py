"""Loads once; INPUT0[0] == 1 makes it die and every later initialize() fail (a marker
file next to the model), as a model whose dependency broke under it; 0 answers [0]."""

import os

import numpy as np

import triton_python_backend_utils as pb_utils


def _marker(args_dir):
    return os.path.join(args_dir, "broken")


class TritonPythonModel:
    def initialize(self, args):
        self.dir = args["model_repository"]
        if os.path.exists(_marker(self.dir)):
            raise RuntimeError("the model's dependency is gone")

    def execute(self, requests):
        responses = []
        for request in requests:
            if pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0] == 1:
                open(_marker(self.dir), "w").close()
                os._exit(3)
            out = pb_utils.Tensor("OUTPUT0", np.zeros(1, dtype=np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
