"""Decoupled: sends INPUT0[0] responses (OUTPUT0 = index), DELAY[0] ms apart, from a thread."""

import contextlib
import threading
import time

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.stream, args=(request,), daemon=True).start()
        return None

    def stream(self, request):
        sender = request.get_response_sender()
        count = int(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0])
        delay = pb_utils.get_input_tensor_by_name(request, "DELAY")
        pause = float(delay.as_numpy()[0]) / 1000 if delay is not None else 0.0
        for index in range(count):
            if sender.is_cancelled():
                break
            if pause:
                time.sleep(pause)
            out = pb_utils.Tensor("OUTPUT0", np.array([index], dtype=np.int32))
            sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        # Sending after FINAL must raise here, in the model, not in the server.
        with contextlib.suppress(pb_utils.TritonModelException):
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
