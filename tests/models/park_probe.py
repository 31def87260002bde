"""Where it runs: INPUT0 = [seconds to work, start a thread (1) or not (0)]; OUTPUT0 = [the
number of cores ``execute`` may run on, its process id]. A started thread lives on (as a
pool's worker would)."""

import json
import os
import threading
import time

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.workers = []
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(
            json.loads(args["model_config"]))

    def execute(self, requests):
        responses = []
        for request in requests:
            seconds, start_thread = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            end = time.monotonic() + float(seconds)
            while time.monotonic() < end:
                pass
            if start_thread:
                worker = threading.Thread(target=threading.Event().wait, daemon=True)
                worker.start()
                self.workers.append(worker)
            cores = np.array([len(os.sched_getaffinity(0)), os.getpid()], dtype=np.int32)
            outputs = [pb_utils.Tensor("OUTPUT0", cores)]
            response = pb_utils.InferenceResponse(output_tensors=outputs)
            if self.decoupled:
                request.get_response_sender().send(
                    response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                responses.append(response)
        return None if self.decoupled else responses
