"""Has no config.pbtxt: declares its tensors from auto_complete_config."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.set_max_batch_size(4)
        config.add_input({"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [-1]})
        config.add_output({"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [-1]})
        return config

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
                "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() * 2)])
            for r in requests
        ]
