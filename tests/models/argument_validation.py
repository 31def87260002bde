"""Triton's QA ``argument_validation`` checks, run inside a model (qa/L0_backend_python).

Each check builds a pb_utils object with arguments Triton's binding refuses and names the
exception Triton raises. OUTPUT0 (BYTES [1]): "ok", or each check that went otherwise.
"""

import numpy as np

import triton_python_backend_utils as pb_utils

DATA = np.asarray([1, 2], dtype=np.int32)
TENSOR = pb_utils.Tensor("INPUT0", DATA)


def _request(**overrides):
    arguments = {"inputs": [TENSOR], "model_name": "my_model",
                 "requested_output_names": ["my_output"], **overrides}
    return pb_utils.InferenceRequest(**arguments)


CHECKS = {
    "request inputs=[None]": (lambda: _request(inputs=[None]), pb_utils.TritonModelException),
    "request inputs=None": (lambda: _request(inputs=None), TypeError),
    "request model_name=None": (lambda: _request(model_name=None), TypeError),
    "request outputs=[None]": (lambda: _request(requested_output_names=[None]), TypeError),
    "request outputs=None": (lambda: _request(requested_output_names=None), TypeError),
    "request correlation_id=None": (lambda: _request(correlation_id=None), TypeError),
    "request request_id=None": (lambda: _request(request_id=None), TypeError),
    "request model_version=None": (lambda: _request(model_version=None), TypeError),
    "request flags=None": (lambda: _request(flags=None), TypeError),
    "response [None]": (lambda: pb_utils.InferenceResponse(output_tensors=[None]),
                        pb_utils.TritonModelException),
    "response None": (lambda: pb_utils.InferenceResponse(output_tensors=None), TypeError),
    "tensor name None": (lambda: pb_utils.Tensor(None, DATA), TypeError),
    "tensor data None": (lambda: pb_utils.Tensor("OUTPUT0", None), TypeError),
    "from_dlpack None": (lambda: pb_utils.Tensor.from_dlpack("OUTPUT0", None),
                         pb_utils.TritonModelException),
    "from_dlpack empty name": (lambda: pb_utils.Tensor.from_dlpack("", None),
                               pb_utils.TritonModelException),
    "tensor empty name, data None": (lambda: pb_utils.Tensor("", None), TypeError),
}


def _failures():
    failures = []
    for name, (make, expected) in CHECKS.items():
        try:
            make()
        except expected:
            continue
        except Exception as exc:  # the wrong kind of refusal
            failures.append(f"{name}: {type(exc).__name__}")
        else:
            failures.append(f"{name}: accepted")
    # What Triton accepts.
    if _request(correlation_id=5).correlation_id() != 5:
        failures.append("correlation_id 5")
    _request(requested_output_names=[], inputs=[])
    pb_utils.InferenceResponse(output_tensors=[])
    return failures


class TritonPythonModel:
    def execute(self, requests):
        text = "; ".join(_failures()) or "ok"
        return [pb_utils.InferenceResponse(
            [pb_utils.Tensor("OUTPUT0", np.array([text.encode()], dtype=np.object_))])
            for _ in requests]
