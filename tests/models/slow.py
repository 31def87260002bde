"""Works for INPUT0[0] seconds in 1 ms steps, polling is_cancelled(); records what it saw.

Each observation is one JSON line appended to the file named by the model parameter
``record_file``: {"event": "start"|"cancelled"|"done", "id": ..., "t": monotonic seconds}.
Decoupled, it also sends a response every 50 ms while it works, then FINAL.
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
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.lock = threading.Lock()

    def record(self, event, request):
        line = json.dumps({"event": event, "id": request.request_id(), "t": time.monotonic()})
        with self.lock, open(self.record_file, "a") as f:
            f.write(line + "\n")

    def execute(self, requests):
        responses = [self.work(request) for request in requests]
        return None if self.decoupled else responses

    def work(self, request):
        self.record("start", request)
        seconds = float(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0])
        sender = request.get_response_sender() if self.decoupled else None
        deadline = time.monotonic() + seconds
        next_tick = time.monotonic()
        while time.monotonic() < deadline:
            if request.is_cancelled():
                self.record("cancelled", request)
                error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
                return self.finish(sender, pb_utils.InferenceResponse(error=error))
            if sender is not None and time.monotonic() >= next_tick:
                next_tick += 0.05
                sender.send(self.answer(seconds))
            time.sleep(0.001)
        self.record("done", request)
        return self.finish(sender, self.answer(seconds))

    def answer(self, seconds):
        out = pb_utils.Tensor("OUTPUT0", np.array([seconds], dtype=np.float32))
        return pb_utils.InferenceResponse(output_tensors=[out])

    def finish(self, sender, response):
        if sender is None:
            return response
        sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
