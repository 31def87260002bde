"""BLS parent that cancels its decoupled child once the sum of its outputs reaches MAX_SUM.

The child is until_cancelled (20 responses of INPUT0, 50 ms apart, IGNORE_CANCEL passed
on). It keeps reading after cancel() and answers SUM (what it added up), IS_CANCELLED (a
response carried CANCELLED) and COUNT (responses read, the FINAL flag included).
"""

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [self.one(request) for request in requests]

    def one(self, request):
        max_sum = int(pb_utils.get_input_tensor_by_name(request, "MAX_SUM").as_numpy()[0])
        child = pb_utils.InferenceRequest(
            model_name="until_cancelled",
            inputs=[
                pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                pb_utils.get_input_tensor_by_name(request, "IGNORE_CANCEL"),
                pb_utils.Tensor("COUNT", np.array([20], dtype=np.int32)),
                pb_utils.Tensor("DELAY", np.array([50], dtype=np.int32)),
            ],
            requested_output_names=["OUTPUT0"],
        )
        responses = child.exec(decoupled=True)
        total, count, cancelled, error = 0, 0, False, None
        for response in responses:
            count += 1
            if response.has_error():
                if response.error().code() == pb_utils.TritonError.CANCELLED:
                    cancelled = True
                else:
                    error = response.error()
                break
            out = pb_utils.get_output_tensor_by_name(response, "OUTPUT0")
            total += int(out.as_numpy()[0]) if out is not None else 0
            if total >= max_sum:
                responses.cancel()
        responses.cancel()  # after the end: a no-op, as in Triton
        outputs = [
            pb_utils.Tensor("SUM", np.array([total], dtype=np.int32)),
            pb_utils.Tensor("IS_CANCELLED", np.array([cancelled], dtype=np.bool_)),
            pb_utils.Tensor("COUNT", np.array([count], dtype=np.int32)),
        ]
        return pb_utils.InferenceResponse(outputs, error=error)
