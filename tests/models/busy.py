"""Pure-Python work in execute(): ``iterations`` (model parameter) turns of a loop that holds
the GIL, as tokenizers and business logic do; copies INPUT0 to OUTPUT0."""

import json

import triton_python_backend_utils as pb_utils


def work(iterations):
    total = 0
    for i in range(iterations):
        total += i * i % 7
    return total


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.iterations = int(config["parameters"]["iterations"]["string_value"])

    def execute(self, requests):
        responses = []
        for request in requests:
            work(self.iterations)
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            out = pb_utils.Tensor("OUTPUT0", tensor.as_numpy())
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
