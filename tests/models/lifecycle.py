"""Records its own lifecycle for tests: initialize, finalize, and every request it works on.

Config parameters: ``record_file`` (JSON lines {"event", "id", "t"} as tests/e2e/observe
reads them) and ``generation`` (echoed back, so a test can tell a reloaded model apart).
Lifecycle events use the id "<model>/<version>/<generation>".

INPUT0[0] is how many seconds to work, polling is_cancelled() every millisecond.
OUTPUT0 = [seconds, generation, version]. Decoupled, it also sends a response every
100 ms, then FINAL; a negative INPUT0[0] sends one response and never sends FINAL.
"""

import json
import threading
import time

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = config["parameters"]
        self.record_file = params["record_file"]["string_value"]
        self.generation = float(params.get("generation", {}).get("string_value", "1"))
        self.version = float(args["model_version"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.name = f"{args['model_name']}/{args['model_version']}/{self.generation:g}"
        self.lock = threading.Lock()
        self.record("initialize", self.name)

    def finalize(self):
        self.record("finalize", self.name)

    def record(self, event, key):
        line = json.dumps({"event": event, "id": key, "t": time.monotonic()})
        with self.lock, open(self.record_file, "a") as f:
            f.write(line + "\n")

    def execute(self, requests):
        responses = [self.work(request) for request in requests]
        return None if self.decoupled else responses

    def work(self, request):
        self.record("start", request.request_id())
        seconds = float(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0])
        sender = request.get_response_sender() if self.decoupled else None
        if sender is not None and seconds < 0:
            sender.send(self.answer(seconds))
            return None  # never FINAL: only an unload or shutdown can release this request
        deadline = time.monotonic() + seconds
        next_tick = time.monotonic()
        while time.monotonic() < deadline:
            if request.is_cancelled():
                self.record("cancelled", request.request_id())
                time.sleep(0.2)  # winding down takes real models a moment
                error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
                return self.finish(sender, pb_utils.InferenceResponse(error=error))
            if sender is not None and time.monotonic() >= next_tick:
                next_tick += 0.1
                sender.send(self.answer(seconds))
            time.sleep(0.001)
        self.record("done", request.request_id())
        return self.finish(sender, self.answer(seconds))

    def answer(self, seconds):
        values = np.array([seconds, self.generation, self.version], dtype=np.float32)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", values)])

    def finish(self, sender, response):
        if sender is None:
            return response
        sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
