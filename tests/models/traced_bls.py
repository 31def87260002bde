"""BLS that passes its request's trace on: calls identity_fp32 with trace=request.trace(),
returns the child's OUTPUT0 and, in CONTEXT, what request.trace().get_context() said."""

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [self.one(request) for request in requests]

    def one(self, request):
        data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
        child = pb_utils.InferenceRequest(
            model_name="identity_fp32", inputs=[pb_utils.Tensor("INPUT0", data)],
            requested_output_names=["OUTPUT0"], trace=request.trace())
        response = child.exec()
        if response.has_error():
            return pb_utils.InferenceResponse(error=response.error())
        out = pb_utils.get_output_tensor_by_name(response, "OUTPUT0").as_numpy()
        context = request.trace().get_context() or ""
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUTPUT0", np.asarray(out, dtype=np.float32)),
            pb_utils.Tensor("CONTEXT", np.array([context.encode()], dtype=np.object_))])
