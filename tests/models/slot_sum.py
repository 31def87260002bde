"""A stateful model that keeps its state per batch slot, as the direct sequence batcher lets it.

The i-th request of an execute is slot i. INPUT0 (INT32 [1]) is added to the slot's sum,
which starts again from 0 on START; a request with READY 0 (padding) leaves the sum alone.
Optional DELAY (FP32 [1]): seconds of work first, in 1 ms steps; a request cancelled
meanwhile is answered CANCELLED. Outputs SUM (INT32 [1]) and SEEN (BYTES [1]), a JSON
object: {"slot", "correlation_id", "batch": [one entry per slot: {"ready", "start",
"end", "corrid", "id", "input", "outputs"}]}.
Appends {"event": "start"|"cancelled"|"done", "id", "t", "instance"} to ``record_file``
for each request it gets, padding included (its id is "").
"""

import json
import threading
import time

import numpy as np

import triton_python_backend_utils as pb_utils

_lock = threading.Lock()


def _value(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy().reshape(-1)[0].item()


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.record_file = config["parameters"]["record_file"]["string_value"]
        self.instance = args["model_instance_name"]
        self.sums = [0] * max(1, config["max_batch_size"])

    def record(self, event, request):
        line = json.dumps({"event": event, "id": request.request_id(), "t": time.monotonic(),
                           "instance": self.instance})
        with _lock, open(self.record_file, "a") as f:
            f.write(line + "\n")

    def execute(self, requests):
        for request in requests:
            self.record("start", request)
        delays = [_value(request, "DELAY") or 0.0 for request in requests]
        cancelled = self.wait(requests, delays)
        batch = [{"ready": _value(r, "READY"), "start": _value(r, "START"),
                  "end": _value(r, "END"), "corrid": _value(r, "CORRID"),
                  "id": r.request_id(), "input": _value(r, "INPUT0"),
                  "outputs": r.requested_output_names()} for r in requests]
        responses = []
        for slot, request in enumerate(requests):
            if slot in cancelled:
                self.record("cancelled", request)
                error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            if batch[slot]["ready"]:
                if batch[slot]["start"]:
                    self.sums[slot] = 0
                self.sums[slot] += batch[slot]["input"]
            seen = {"slot": slot, "correlation_id": request.correlation_id(), "batch": batch}
            self.record("done", request)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("SUM", np.array([[self.sums[slot]]], dtype=np.int32)),
                pb_utils.Tensor("SEEN", np.array([[json.dumps(seen).encode()]],
                                                 dtype=np.object_)),
            ]))
        return responses

    @staticmethod
    def wait(requests, delays):
        """Sleep out the longest delay, in 1 ms steps; the slots cancelled meanwhile."""
        deadline = time.monotonic() + max(delays)
        waiting = {slot for slot, delay in enumerate(delays) if delay}
        cancelled = set()
        while waiting and time.monotonic() < deadline:
            for slot in list(waiting):
                if requests[slot].is_cancelled():
                    waiting.discard(slot)
                    cancelled.add(slot)
            time.sleep(0.001)
        return cancelled
