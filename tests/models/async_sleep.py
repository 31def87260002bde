"""async def execute: awaits INPUT0[0] seconds; OUTPUT0 = [start, end] monotonic times."""

import asyncio
import time

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        return [await self.one(request) for request in requests]

    async def one(self, request):
        seconds = float(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0])
        start = time.monotonic()
        await asyncio.sleep(seconds)
        out = np.array([start, time.monotonic()], dtype=np.float64)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", out)])
