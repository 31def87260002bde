"""Async decoupled BLS parent: `await request.async_exec(decoupled=True)`, then iterates.

Request parameter "iterate": "for" (Triton's plain loop; child async_decoupled sleeps
INPUT0[0] s, then answers once) or "async for" (child repeat: 5 responses INPUT0[0] / 5 s
apart). Sends OUTPUT0 = [start, end] (time.monotonic) of its own work, with FINAL.
"""

import json
import time

import numpy as np

import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    async def execute(self, requests):
        for request in requests:
            await self.one(request)
        return None

    async def one(self, request):
        start = time.monotonic()
        sender = request.get_response_sender()
        seconds = float(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0])
        if json.loads(request.parameters()).get("iterate") == "async for":
            inputs = [pb_utils.Tensor("INPUT0", np.array([5], dtype=np.int32)),
                      pb_utils.Tensor("DELAY", np.array([seconds * 200], dtype=np.float32))]
            responses = await self.child("repeat", inputs).async_exec(decoupled=True)
            parts = [part async for part in responses]
        else:
            inputs = [pb_utils.Tensor("INPUT0", np.array([seconds], dtype=np.float32))]
            responses = await self.child("async_decoupled", inputs).async_exec(decoupled=True)
            parts = list(responses)
        for part in parts:
            if part.has_error():
                sender.send(pb_utils.InferenceResponse(error=part.error()), flags=FINAL)
                return
        out = np.array([start, time.monotonic()], dtype=np.float64)
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", out)]), flags=FINAL)

    @staticmethod
    def child(name, inputs):
        return pb_utils.InferenceRequest(
            model_name=name, inputs=inputs, requested_output_names=["OUTPUT0"])
