"""Triton's QA ``identity_bf16`` without torch: BF16 passes through DLPack, and
``as_numpy()`` on a BF16 tensor must refuse with Triton's text (an error response if not)."""

import triton_python_backend_utils as pb_utils

EXPECTED = "tensor dtype is bf16 and cannot be converted to numpy"


def _refuses_numpy(tensor):
    try:
        tensor.as_numpy()
    except pb_utils.TritonModelException as exc:
        return EXPECTED in str(exc).lower()
    return False


class TritonPythonModel:
    def execute(self, requests):
        return [self.respond(request) for request in requests]

    def respond(self, request):
        tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
        output = pb_utils.Tensor.from_dlpack("OUTPUT0", tensor.to_dlpack())
        if not (_refuses_numpy(tensor) and _refuses_numpy(output)):
            return pb_utils.InferenceResponse(
                error=pb_utils.TritonError("as_numpy() converted a BF16 tensor"))
        return pb_utils.InferenceResponse([output])
