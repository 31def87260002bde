"""Forks a child that lingers for a minute (as a multiprocessing worker would) and answers
OUTPUT0 = [its pid]."""

import os
import time

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for _ in requests:
            pid = os.fork()
            if pid == 0:
                devnull = os.open(os.devnull, os.O_RDWR)
                os.dup2(devnull, 1)
                os.dup2(devnull, 2)  # the server's log pipe: its reader waits for every copy
                time.sleep(60)
                os._exit(0)
            out = pb_utils.Tensor("OUTPUT0", np.array([pid], dtype=np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
