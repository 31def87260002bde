"""An async non-decoupled model: execute returns None, a task sends OUTPUT0 = INPUT0 later."""

import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.tasks = set()

    async def execute(self, requests):
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy().copy()
            task = asyncio.create_task(self.answer_later(request.get_response_sender(), data))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        return None

    async def answer_later(self, sender, data):
        await asyncio.sleep(0.2)  # the model's own pace: after execute has returned
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data)]), flags=final)
