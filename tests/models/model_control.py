"""Calls pb_utils' model loading API: ACTION (BYTES) is load / load_config / load_files /
unload / unload_dependents / ready, on the model named by NAME (BYTES), VERSION (BYTES) for ready.

OUTPUT0 (BOOL) is is_model_ready's answer (False for the other actions); an exception
the call raises becomes the response's error, "<type>: <message>".
"""

import json

import numpy as np

import triton_python_backend_utils as pb_utils

IDENTITY_CONFIG = {
    "backend": "python",
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
}
IDENTITY_SOURCE = b"""
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() * 2)])
            for r in requests]
"""


def text(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy()[0].decode()


class TritonPythonModel:
    def execute(self, requests):
        return [self.one(request) for request in requests]

    def one(self, request):
        action, name = text(request, "ACTION"), text(request, "NAME")
        try:
            ready = self.act(action, name, text(request, "VERSION"))
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}"
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))
        out = pb_utils.Tensor("OUTPUT0", np.array([ready], dtype=np.bool_))
        return pb_utils.InferenceResponse([out])

    @staticmethod
    def act(action, name, version):
        if action == "ready":
            return pb_utils.is_model_ready(name, version)
        if action == "load":
            pb_utils.load_model(name)
        elif action == "load_config":
            pb_utils.load_model(model_name=name, config=json.dumps(IDENTITY_CONFIG))
        elif action == "load_files":
            pb_utils.load_model(name, json.dumps(IDENTITY_CONFIG),
                                {"file:1/model.py": IDENTITY_SOURCE})
        elif action == "unload":
            pb_utils.unload_model(name, unload_dependents=False)
        elif action == "unload_dependents":
            pb_utils.unload_model(name, unload_dependents=True)
        else:
            raise ValueError(f"unknown action {action}")
        return False
