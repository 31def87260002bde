"""BLS round trips in a loop: INPUT0 (INT32 [2]) is the call count and how many FP32
values each child request carries; OUTPUT0 (FP64 [2]) is the mean ns of one blocking
``exec()`` of identity_fp32 and of one ``exec(decoupled=True)`` of repeat_one, read to
its end."""

import time

import numpy as np

import triton_python_backend_utils as pb_utils


def child(model, data):
    return pb_utils.InferenceRequest(model_name=model, inputs=[pb_utils.Tensor("INPUT0", data)],
                                     requested_output_names=["OUTPUT0"])


class TritonPythonModel:
    def execute(self, requests):
        return [self.one(request) for request in requests]

    def one(self, request):
        count, width = (int(v) for v in
                        pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy())
        data = np.ones(width, dtype=np.float32)
        started = time.perf_counter_ns()
        for _ in range(count):
            response = child("identity_fp32", data).exec()
            if response.has_error():
                return pb_utils.InferenceResponse(error=response.error())
        single = (time.perf_counter_ns() - started) / count
        started = time.perf_counter_ns()
        for _ in range(count):
            for part in child("identity_fp32", data).exec(decoupled=True):
                if part.has_error():
                    return pb_utils.InferenceResponse(error=part.error())
        stream = (time.perf_counter_ns() - started) / count
        out = np.array([single, stream], dtype=np.float64)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", out)])
