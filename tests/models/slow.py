"""Works for INPUT0[0] seconds in 1 ms steps, polling is_cancelled(); records what it saw.

Each observation is one JSON line appended to the file named by the model parameter
``record_file``: {"event": "start"|"cancelled"|"done", "id": ..., "t": monotonic seconds}.
"""

import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.record_file = config["parameters"]["record_file"]["string_value"]
        self.lock = threading.Lock()

    def record(self, event, request):
        line = json.dumps({"event": event, "id": request.request_id(), "t": time.monotonic()})
        with self.lock, open(self.record_file, "a") as f:
            f.write(line + "\n")

    def execute(self, requests):
        responses = []
        for request in requests:
            self.record("start", request)
            seconds = float(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0])
            deadline = time.monotonic() + seconds
            cancelled = False
            while time.monotonic() < deadline:
                if request.is_cancelled():
                    cancelled = True
                    break
                time.sleep(0.001)
            if cancelled:
                self.record("cancelled", request)
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)))
            else:
                self.record("done", request)
                responses.append(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("OUTPUT0", np.array([seconds], dtype=np.float32))]))
        return responses
