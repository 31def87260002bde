"""Decoupled async model: awaits INPUT0[0] seconds, then sends [start, end] and FINAL."""

import asyncio
import time

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            seconds = float(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0])
            start = time.monotonic()
            await asyncio.sleep(seconds)
            out = np.array([start, time.monotonic()], dtype=np.float64)
            response = pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", out)])
            sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
