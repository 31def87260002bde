"""Records every execute() call it gets, sleeping as long as its requests ask.

INPUT0 (FP32, one value per batch element) is a number of seconds: a call sleeps for the
largest value in its batch and returns INPUT0 as OUTPUT0. Each call appends one JSON line
to the file named by the model parameter ``record_file``: one when it starts,
{"event": "start", "ids": [...]}, and one when it ends:
{"event": "execute", "ids": [...], "sizes": [...], "instance": ..., "start": t, "end": t}
(t in monotonic seconds); ``initialize`` appends
{"event": "init", "instance": ..., "kind": ..., "device_id": ...}.
"""

import json
import threading
import time

import numpy as np

import triton_python_backend_utils as pb_utils

_lock = threading.Lock()


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.record_file = config["parameters"]["record_file"]["string_value"]
        self.batched = config.get("max_batch_size", 0) > 0
        self.instance = args["model_instance_name"]
        self.record({"event": "init", "instance": self.instance,
                     "kind": args["model_instance_kind"],
                     "device_id": args["model_instance_device_id"]})

    def record(self, entry):
        with _lock, open(self.record_file, "a") as f:
            f.write(json.dumps(entry) + "\n")

    def execute(self, requests):
        start = time.monotonic()
        ids = [r.request_id() for r in requests]
        self.record({"event": "start", "ids": ids})
        inputs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        seconds = max(float(np.max(x)) for x in inputs)
        time.sleep(seconds)
        self.record({
            "event": "execute",
            "ids": ids,
            "sizes": [int(x.shape[0]) if self.batched else 1 for x in inputs],
            "instance": self.instance,
            "start": start,
            "end": time.monotonic(),
        })
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", x)])
                for x in inputs]
