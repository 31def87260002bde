"""BLS into the iterative models (tests/models/reschedule.py), as Triton's
bls_request_rescheduling QA model does: IN (INT32 [1]) executions each; SEEN (BYTES [1]) is
JSON {"count": OUT of reschedule_iterative, "stream": OUTs of reschedule_iterative_decoupled,
"errors": [error messages]}.
"""

import json

import numpy as np

import triton_python_backend_utils as pb_utils


def child(model, times):
    return pb_utils.InferenceRequest(
        model_name=model, inputs=[pb_utils.Tensor("IN", np.array([times], dtype=np.int32))],
        requested_output_names=["OUT"])


class TritonPythonModel:
    def execute(self, requests):
        return [self.one(request) for request in requests]

    def one(self, request):
        times = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
        errors = []
        plain = child("reschedule_iterative", times).exec()
        if plain.has_error():
            errors.append(plain.error().message())
            count = None
        else:
            count = int(pb_utils.get_output_tensor_by_name(plain, "OUT").as_numpy()[0])
        stream = []
        for response in child("reschedule_iterative_decoupled", times).exec(decoupled=True):
            if response.has_error():
                errors.append(response.error().message())
            elif response.output_tensors():
                stream.append(int(pb_utils.get_output_tensor_by_name(response, "OUT")
                                  .as_numpy()[0]))
        seen = json.dumps({"count": count, "stream": stream, "errors": errors})
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUT", np.array([times], dtype=np.int32)),
            pb_utils.Tensor("SEEN", np.array([seen.encode()], dtype=np.object_))])
