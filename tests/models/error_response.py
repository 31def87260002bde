"""Answers each request with an error response carrying the code named by INPUT0."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            name = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0].decode()
            code = getattr(pb_utils.TritonError, name)
            responses.append(pb_utils.InferenceResponse(
                error=pb_utils.TritonError(f"model refused: {name}", code)
            ))
        return responses
