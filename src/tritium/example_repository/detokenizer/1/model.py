"""Turns one word piece ("▁fox ") back into the text it stands for ("fox ")."""

import numpy as np

import triton_python_backend_utils as pb_utils

WORD_MARK = "\u2581"


class TritonPythonModel:
    def execute(self, requests):
        return [self.detokenize(request) for request in requests]

    def detokenize(self, request):
        piece = pb_utils.get_input_tensor_by_name(request, "piece").as_numpy()
        text = piece.reshape(-1)[0].decode("utf-8", "replace").strip().removeprefix(WORD_MARK)
        out = pb_utils.Tensor("text_output", np.array([f"{text} ".encode()], dtype=np.object_))
        return pb_utils.InferenceResponse(output_tensors=[out])
