"""A non-decoupled model answering through its response sender; MODE (BYTES) picks how.

after_return: execute returns None; a thread sends OUTPUT0 = INPUT0 with FINAL later.
after_return_list: the same, returning [None] for each request.
two_before_return: sends INPUT0, then INPUT0 + 1 (which raises) before returning.
sent_and_returned: sends INPUT0 with FINAL, then also returns a response (INPUT0 + 1).
abandon: returns None and drops the request without ever sending.
"""

import threading
import time

import numpy as np

import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def response(data):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.asarray(data))])


def send_later(sender, data, returned):
    returned.wait()
    time.sleep(0.2)  # the model's own pace: well after execute has returned
    sender.send(response(data), flags=FINAL)


class TritonPythonModel:
    def execute(self, requests):
        returned = threading.Event()
        results = [self.one(request, returned) for request in requests]
        returned.set()
        if all(result is None for result in results) and self.mode(requests[0]) != (
            "after_return_list"
        ):
            return None
        return results

    @staticmethod
    def mode(request):
        return pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()

    def one(self, request, returned):
        mode = self.mode(request)
        data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
        if mode in ("after_return", "after_return_list"):
            sender = request.get_response_sender()
            threading.Thread(target=send_later, args=(sender, data.copy(), returned),
                             daemon=True).start()
            return None
        if mode == "two_before_return":
            sender = request.get_response_sender()
            sender.send(response(data))
            sender.send(response(data + 1))  # raises: non-decoupled, second response
        if mode == "sent_and_returned":
            request.get_response_sender().send(response(data), flags=FINAL)
            return response(data + 1)
        return None
