"""A stateful model: each instance keeps a running sum per correlation id.

INPUT0 (INT32 [1]) is added to the sum of the request's sequence, which starts again from 0
on a request with the START flag. Optional DELAY (FP32 [1]): seconds of work first, in 1 ms
steps polling is_cancelled(). Outputs SUM (INT32 [1]) and SEEN (BYTES [1]), a JSON object:
{"instance", "correlation_id", "flags", "controls": {name: value}} where ``controls`` are
the inputs besides INPUT0 and DELAY (the sequence batcher's control tensors).
Appends {"event": "start"|"cancelled"|"done", "id", "t", "instance"} to ``record_file``.
"""

import json
import threading
import time

import numpy as np

import triton_python_backend_utils as pb_utils

_lock = threading.Lock()
_OWN_INPUTS = ("INPUT0", "DELAY")


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.record_file = config["parameters"]["record_file"]["string_value"]
        self.instance = args["model_instance_name"]
        self.sums = {}

    def record(self, event, request):
        line = json.dumps({"event": event, "id": request.request_id(), "t": time.monotonic(),
                           "instance": self.instance})
        with _lock, open(self.record_file, "a") as f:
            f.write(line + "\n")

    def execute(self, requests):
        return [self.work(request) for request in requests]

    def work(self, request):
        self.record("start", request)
        delay = pb_utils.get_input_tensor_by_name(request, "DELAY")
        deadline = time.monotonic() + (0.0 if delay is None else float(delay.as_numpy()[0]))
        while time.monotonic() < deadline:
            if request.is_cancelled():
                self.record("cancelled", request)
                error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
                return pb_utils.InferenceResponse(error=error)
            time.sleep(0.001)
        key = request.correlation_id()
        if request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
            self.sums[key] = 0
        value = int(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0])
        self.sums[key] = self.sums.get(key, 0) + value
        seen = {
            "instance": self.instance,
            "correlation_id": key,
            "flags": request.flags(),
            "controls": {t.name(): _plain(t.as_numpy()) for t in request.inputs()
                         if t.name() not in _OWN_INPUTS},
        }
        self.record("done", request)
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("SUM", np.array([self.sums[key]], dtype=np.int32)),
            pb_utils.Tensor("SEEN", np.array([json.dumps(seen).encode()], dtype=np.object_)),
        ])


def _plain(array):
    value = array.reshape(-1)[0]
    return value.decode() if isinstance(value, bytes) else value.item()
