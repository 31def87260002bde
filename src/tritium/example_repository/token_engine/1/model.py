"""Streams tokens derived from the prompt, one per step, until done or cancelled."""

import json
import threading
import time

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.delay = int(config["parameters"]["token_delay_ms"]["string_value"]) / 1000
        self.log = pb_utils.Logger

    def execute(self, requests):
        # Each request streams from its own thread so one instance serves many at once.
        for request in requests:
            threading.Thread(target=self.generate, args=(request,), daemon=True).start()
        return None

    def generate(self, request):
        sender = request.get_response_sender()
        prompt = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
        words = prompt.reshape(-1)[0].decode().split() or ["token"]
        limit = pb_utils.get_input_tensor_by_name(request, "max_tokens")
        max_tokens = int(limit.as_numpy().reshape(-1)[0]) if limit is not None else 16
        for step in range(max_tokens):
            if sender.is_cancelled():
                self.log.log_info(
                    f"token_engine: request {request.request_id()!r} cancelled after "
                    f"{step} of {max_tokens} tokens"
                )
                break
            time.sleep(self.delay)
            token = f"{words[step % len(words)]} "
            out = pb_utils.Tensor("text_output", np.array([token.encode()], dtype=np.object_))
            sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
