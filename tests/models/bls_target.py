"""BLS: calls the model named by the config parameter ``target`` with INPUT0 (FP32), passing
on the request's id, and answers with that model's OUTPUT0 (or its error)."""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.target = config["parameters"]["target"]["string_value"]

    def execute(self, requests):
        return [self.one(request) for request in requests]

    def one(self, request):
        data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
        child = pb_utils.InferenceRequest(
            model_name=self.target,
            inputs=[pb_utils.Tensor("INPUT0", data)],
            requested_output_names=["OUTPUT0"],
            request_id=request.request_id(),
        )
        response = child.exec()
        if response.has_error():
            return pb_utils.InferenceResponse(error=response.error())
        out = pb_utils.get_output_tensor_by_name(response, "OUTPUT0").as_numpy()
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", out)])
