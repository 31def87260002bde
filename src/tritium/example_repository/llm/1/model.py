"""BLS front: forwards the prompt to token_engine and relays or gathers its tokens."""

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            self.serve(request)
        return None

    def serve(self, request):
        sender = request.get_response_sender()
        stream = pb_utils.get_input_tensor_by_name(request, "stream")
        streaming = bool(stream.as_numpy().reshape(-1)[0]) if stream is not None else False
        inputs = [pb_utils.get_input_tensor_by_name(request, "text_input")]
        limit = pb_utils.get_input_tensor_by_name(request, "max_tokens")
        if limit is not None:
            inputs.append(limit)
        engine = pb_utils.InferenceRequest(
            model_name="token_engine",
            inputs=inputs,
            requested_output_names=["text_output"],
            request_id=request.request_id(),
        )
        text = []
        for response in engine.exec(decoupled=True):
            if request.is_cancelled():
                # The engine request shares this request's cancellation and stops too.
                break
            if response.has_error():
                sender.send(pb_utils.InferenceResponse(error=response.error()),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            token = pb_utils.get_output_tensor_by_name(response, "text_output")
            if token is None:
                continue
            if streaming:
                sender.send(pb_utils.InferenceResponse(output_tensors=[token]))
            else:
                text.append(token.as_numpy().reshape(-1)[0])
        if not streaming and not request.is_cancelled():
            whole = np.array([b"".join(text)], dtype=np.object_)
            sender.send(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("text_output", whole)]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
