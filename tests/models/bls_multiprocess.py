"""Triton's ``test_multiprocess`` shape: execute() runs BLS from the ten workers of a
``multiprocessing.Pool`` (forked), each sending INPUT0 to the model named by the
``target`` parameter and checking its OUTPUT0; answers OUTPUT0 = [how many matched]."""

import json
from multiprocessing import Pool

import numpy as np

import triton_python_backend_utils as pb_utils

TARGET = ""


def _bls(value):
    request = pb_utils.InferenceRequest(
        model_name=TARGET, requested_output_names=["OUTPUT0"],
        inputs=[pb_utils.Tensor("INPUT0", np.array([value], dtype=np.float32))])
    response = request.exec()
    if response.has_error():
        return response.error().message()
    out = pb_utils.get_output_tensor_by_name(response, "OUTPUT0").as_numpy()
    return float(out[0]) == value


class TritonPythonModel:
    def initialize(self, args):
        global TARGET
        TARGET = json.loads(args["model_config"])["parameters"]["target"]["string_value"]

    def execute(self, requests):
        responses = []
        for _ in requests:
            with Pool(10) as pool:
                results = pool.map(_bls, [float(i) for i in range(10)])
            matched = sum(1 for r in results if r is True)
            errors = [r for r in results if r is not True]
            if errors:
                raise pb_utils.TritonModelException(f"BLS in a worker failed: {errors[0]}")
            out = pb_utils.Tensor("OUTPUT0", np.array([matched], dtype=np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
