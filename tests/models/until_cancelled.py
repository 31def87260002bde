"""Decoupled: sends INPUT0 up to COUNT times, DELAY ms apart, until its request is cancelled.

Unless IGNORE_CANCEL is true, a cancellation ends it with its own CANCELLED error
("request has been cancelled") and FINAL; with IGNORE_CANCEL it sends all COUNT.
"""

import time

import numpy as np

import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def value(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy()[0]


class TritonPythonModel:
    def execute(self, requests):
        request = requests[0]
        count, delay = int(value(request, "COUNT")), int(value(request, "DELAY"))
        ignore_cancel = bool(value(request, "IGNORE_CANCEL"))
        data = np.array([value(request, "INPUT0")], dtype=np.int32)
        sender = request.get_response_sender()
        for sent in range(1, count + 1):
            if not ignore_cancel and request.is_cancelled():
                error = pb_utils.TritonError("request has been cancelled",
                                             pb_utils.TritonError.CANCELLED)
                sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
                return None
            response = pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data)])
            sender.send(response, flags=FINAL if sent == count else 0)
            time.sleep(delay / 1000)
        return None
