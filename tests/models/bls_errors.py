"""BLS calls that fail as MODE (BYTES) says; OUTPUT0 is the error message each got."""

import numpy as np

import triton_python_backend_utils as pb_utils


def _request(model, inputs):
    return pb_utils.InferenceRequest(model_name=model, inputs=inputs,
                                     requested_output_names=["OUTPUT0"])


def _unknown_model():
    return _request("non_existent_model", []).exec()


def _unknown_model_decoupled():
    return next(iter(_request("non_existent_model", []).exec(decoupled=True)))


def _missing_input():
    data = np.zeros(16, dtype=np.float32)
    return _request("add_sub", [pb_utils.Tensor("INPUT0", data)]).exec()


def _decoupled_child():
    count = np.array([1], dtype=np.int32)
    return _request("repeat", [pb_utils.Tensor("INPUT0", count)]).exec()


CASES = {
    "unknown_model": _unknown_model,
    "unknown_model_decoupled": _unknown_model_decoupled,
    "missing_input": _missing_input,
    "decoupled_child": _decoupled_child,
}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
            response = CASES[mode]()
            text = response.error().message() if response.has_error() else "no error"
            out = pb_utils.Tensor("OUTPUT0", np.array([text.encode()], dtype=np.object_))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
