"""Measures request.is_cancelled() from inside execute(): OUTPUT0 = [ns per call] over
INPUT0[0] calls (the loop's own cost measured apart and taken off)."""

import time

import numpy as np

import triton_python_backend_utils as pb_utils


def _noop():
    return False


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            calls = int(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0])
            check = request.is_cancelled
            started = time.perf_counter_ns()
            for _ in range(calls):
                check()
            polled = time.perf_counter_ns() - started
            started = time.perf_counter_ns()
            for _ in range(calls):
                _noop()
            empty = time.perf_counter_ns() - started
            per_call = max(polled - empty, 0) / calls
            out = pb_utils.Tensor("OUTPUT0", np.array([per_call, polled / calls],
                                                      dtype=np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
