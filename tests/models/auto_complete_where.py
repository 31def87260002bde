"""auto_complete_config declares INPUT0/OUTPUT0 (INT32, doubled); every process that
imports this file appends its pid to imported_by.txt beside it. With AUTO_COMPLETE_EXIT
set in its config parameters, auto_complete_config ends its process instead."""

import os
from pathlib import Path

import triton_python_backend_utils as pb_utils

with open(Path(__file__).parent / "imported_by.txt", "a") as record:
    record.write(f"{os.getpid()}\n")


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        if "AUTO_COMPLETE_EXIT" in config.as_dict().get("parameters", {}):
            os._exit(3)
        config.add_input({"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [-1]})
        config.add_output({"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [-1]})
        return config

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
                "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() * 2)])
            for r in requests
        ]
