"""Reports the cores its code may run on: OUTPUT0 = [cores seen in initialize, in execute,
in a thread started by execute]."""

import os
import threading

import numpy as np

import triton_python_backend_utils as pb_utils


def _cores():
    return len(os.sched_getaffinity(0))


class TritonPythonModel:
    def initialize(self, args):
        self.at_initialize = _cores()

    def execute(self, requests):
        seen = []
        worker = threading.Thread(target=lambda: seen.append(_cores()))
        worker.start()
        worker.join()
        counts = np.array([self.at_initialize, _cores(), seen[0]], dtype=np.int32)
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", counts)])
                for _ in requests]
