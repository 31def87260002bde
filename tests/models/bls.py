"""BLS: MODE (BYTES) picks how it calls other models; OUTPUT0 carries the child's result.

exec: identity_fp32 on INPUT0; decoupled: repeat with INPUT0 as count, sums the indices;
error: calls the model that raises and returns its error; slow: runs `slow_child` for
INPUT0 seconds (its cancellation follows this request's).
"""

import numpy as np

import triton_python_backend_utils as pb_utils


def child(model, name, data, request_id=""):
    return pb_utils.InferenceRequest(
        model_name=model,
        inputs=[pb_utils.Tensor(name, data)],
        requested_output_names=["OUTPUT0"],
        request_id=request_id,
    )


class TritonPythonModel:
    def execute(self, requests):
        return [self.one(request) for request in requests]

    def one(self, request):
        mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
        data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
        if mode == "exec":
            response = child("identity_fp32", "INPUT0", data).exec()
        elif mode == "error":
            response = child("raises", "INPUT0", data).exec()
        elif mode == "slow":
            response = child("slow_child", "INPUT0", data, request.request_id()).exec()
        else:
            count = np.array([int(data[0])], dtype=np.int32)
            total = 0
            for part in child("repeat", "INPUT0", count).exec(decoupled=True):
                if part.has_error():
                    return pb_utils.InferenceResponse(error=part.error())
                out = pb_utils.get_output_tensor_by_name(part, "OUTPUT0")
                if out is not None:
                    total += int(out.as_numpy()[0])
            value = np.array([float(total)], dtype=np.float32)
            return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", value)])
        if response.has_error():
            return pb_utils.InferenceResponse(error=response.error())
        out = pb_utils.get_output_tensor_by_name(response, "OUTPUT0").as_numpy()
        result = np.asarray(out, dtype=np.float32).reshape(-1)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", result)])
