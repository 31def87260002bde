"""Copies every INPUTk to OUTPUTk, whatever the data type."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = [
                pb_utils.Tensor(tensor.name().replace("INPUT", "OUTPUT"), tensor.as_numpy())
                for tensor in request.inputs()
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
