"""OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (the other way round with the model
parameter ``swap`` set to "true"); records initialize arguments."""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = args
        config = json.loads(args["model_config"])
        self.dtype = pb_utils.triton_string_to_numpy(
            pb_utils.get_output_config_by_name(config, "OUTPUT0")["data_type"]
        )
        swap = config.get("parameters", {}).get("swap", {}).get("string_value")
        self.names = ("OUTPUT1", "OUTPUT0") if swap == "true" else ("OUTPUT0", "OUTPUT1")

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[
                    pb_utils.Tensor(self.names[0], (a + b).astype(self.dtype)),
                    pb_utils.Tensor(self.names[1], (a - b).astype(self.dtype)),
                ],
                parameters={"instance": self.args["model_instance_name"]},
            ))
        return responses
