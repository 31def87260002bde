"""async BLS: awaits two identity_fp32 children concurrently and adds their outputs."""

import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            calls = [
                pb_utils.InferenceRequest(
                    model_name="identity_fp32",
                    inputs=[pb_utils.Tensor("INPUT0", data)],
                    requested_output_names=["OUTPUT0"],
                ).async_exec()
                for _ in range(2)
            ]
            a, b = await asyncio.gather(*calls)
            total = (pb_utils.get_output_tensor_by_name(a, "OUTPUT0").as_numpy()
                     + pb_utils.get_output_tensor_by_name(b, "OUTPUT0").as_numpy())
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUTPUT0", total)]))
        return responses
