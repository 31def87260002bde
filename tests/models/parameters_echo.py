"""Answers PARAMS: the request's parameters as the model reads them (a JSON text)."""

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = np.array([request.parameters().encode()], dtype=object)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("PARAMS", text)]))
        return responses
