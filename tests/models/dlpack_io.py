"""Triton's QA ``dlpack_io_identity`` models without a GPU (qa/python_models).

OUTPUT0 is INPUT0 passed on through DLPack, NEXT_GPU_OUTPUT is GPU_OUTPUT without its first
element (so after three steps of an ensemble it is empty). A model not named ``*_1`` checks
itself first with a BLS call to the model of that name, passing its own input tensors on.
Decoupled (by config): each request is answered from a thread after ``delay`` seconds (a
parameter; default 0), with two responses and then the final flag.
"""

import json
import threading
import time

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.name = args["model_name"]
        self.first = self.name.rsplit("_", 1)[0] + "_1"
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        delay = config.get("parameters", {}).get("delay", {}).get("string_value", "0")
        self.delay = float(delay)

    def execute(self, requests):
        if not self.decoupled:
            return [self.respond(request) for request in requests]
        for request in requests:
            threading.Thread(target=self.send, daemon=True,
                             args=(request.get_response_sender(), self.respond(request))).start()
        return None

    def send(self, sender, response):
        time.sleep(self.delay)
        for _ in range(2):
            sender.send(response)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def respond(self, request):
        input0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
        gpu_output = pb_utils.get_input_tensor_by_name(request, "GPU_OUTPUT")
        output0 = pb_utils.Tensor.from_dlpack("OUTPUT0", input0.to_dlpack())
        following = pb_utils.Tensor("NEXT_GPU_OUTPUT", gpu_output.as_numpy()[1:])
        if self.name != self.first and not self.decoupled:
            self.check_through_bls(input0, gpu_output)
        return pb_utils.InferenceResponse([output0, following])

    def check_through_bls(self, input0, gpu_output):
        response = pb_utils.InferenceRequest(
            model_name=self.first, inputs=[input0, gpu_output],
            requested_output_names=["OUTPUT0"]).exec()
        if response.has_error():
            raise pb_utils.TritonModelException(response.error().message())
        echoed = pb_utils.get_output_tensor_by_name(response, "OUTPUT0").as_numpy()
        if not np.allclose(echoed, input0.as_numpy()):
            raise pb_utils.TritonModelException("BLS input and output tensors are not equal")
