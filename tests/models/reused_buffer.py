"""Decoupled: sends INPUT0[0] responses from execute itself, each OUTPUT0 = its index, all
from one array it overwrites between sends (a response holds what it had when sent)."""

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            count = int(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0])
            buffer = np.zeros(1, dtype=np.int32)
            for index in range(count):
                buffer[0] = index
                sender.send(pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor("OUTPUT0", buffer)]))
            buffer[0] = -1
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
