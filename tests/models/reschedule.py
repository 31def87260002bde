"""Reschedules each request until it has been executed IN (INT32 [1]) times.

Not decoupled: every execution but the last releases the request with RESCHEDULE and
returns None for it; the last answers OUT (INT32 [1]: the number of executions) and SEEN
(BYTES [1]: JSON list of [correlation_id, flags] per execution). Decoupled: every execution
sends OUT (the executions still to come) and SEEN so far; the last sends them with FINAL.
Config parameter "misuse" = "return_response": returns the response of a rescheduled
request instead of None (Triton refuses that).
"""

import json

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.misuse = config["parameters"].get("misuse", {}).get("string_value", "")
        self.seen = {}  # correlation id -> [[correlation_id, flags], ...]

    def execute(self, requests):
        responses = [self.step(request) for request in requests]
        return None if self.decoupled else responses

    def step(self, request):
        wanted = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
        key = request.correlation_id()
        # Outside a sequence (id 0) nothing can come back: each request starts afresh.
        seen = self.seen.setdefault(key, []) if key else []
        seen.append([key, request.flags()])
        done = len(seen) >= wanted
        response = pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUT", np.array([wanted - len(seen) if self.decoupled
                                             else len(seen)], dtype=np.int32)),
            pb_utils.Tensor("SEEN", np.array([json.dumps(seen).encode()], dtype=np.object_)),
        ])
        if done:
            self.seen.pop(key, None)
        else:
            request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
        if self.decoupled:
            flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if done else 0
            request.get_response_sender().send(response, flags=flags)
            return None
        if done or self.misuse == "return_response":
            return response
        return None
