"""Splits the prompt into lower-case word pieces, each marked "▁" as SentencePiece does."""

import numpy as np

import triton_python_backend_utils as pb_utils

WORD_MARK = "\u2581"


class TritonPythonModel:
    def execute(self, requests):
        return [self.tokenize(request) for request in requests]

    def tokenize(self, request):
        prompt = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
        words = prompt.reshape(-1)[0].decode("utf-8", "replace").lower().split()
        pieces = " ".join(WORD_MARK + word for word in words)
        out = pb_utils.Tensor("pieces", np.array([pieces.encode()], dtype=np.object_))
        return pb_utils.InferenceResponse(output_tensors=[out])
