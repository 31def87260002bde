"""Decoupled: answers OUTPUT0 = INPUT0, then an INTERNAL error response; MODE (BYTES) says
whether the error carries FINAL ("final") or FINAL follows 300 ms later ("late_final")."""

import threading
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.answer, args=(request,), daemon=True).start()
        return None

    def answer(self, request):
        sender = request.get_response_sender()
        value = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
        mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
        out = pb_utils.Tensor("OUTPUT0", value)
        sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
        error = pb_utils.InferenceResponse(error=pb_utils.TritonError("the model failed"))
        if mode == "final":
            sender.send(error, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        sender.send(error)
        time.sleep(0.3)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
