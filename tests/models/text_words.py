"""A text model in the generate convention (text_input -> text_output) for the OpenAI tests.

mode "echo": answers once with a JSON description of every input it received (name ->
datatype, shape, values). mode "words": answers with the prompt's words, one per step of
``step_ms``, ``max_tokens`` of them (default 8), polling is_cancelled(); decoupled, one
response per word, else one with them all. Both report num_input_tokens/num_output_tokens
(words). With ``record_file`` set, it appends {"event": "start"|"cancelled"|"done", "id",
"t"} lines as tests/models/slow.py does. A prompt word "fail" fails the request (an error
response) when its turn comes, after the words before it were sent.
"""

import json
import threading
import time

import numpy as np

import triton_python_backend_utils as pb_utils


class Failed(Exception):
    pass


def _value(item):
    return item.decode() if isinstance(item, bytes) else item


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.mode = params.get("mode", "words")
        self.step = int(params.get("step_ms", "20")) / 1000
        self.record_file = params.get("record_file")
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.lock = threading.Lock()

    def record(self, event, request):
        if not self.record_file:
            return
        line = json.dumps({"event": event, "id": request.request_id(), "t": time.monotonic()})
        with self.lock, open(self.record_file, "a") as f:
            f.write(line + "\n")

    def execute(self, requests):
        if not self.decoupled:
            return [self.answer(request) for request in requests]
        for request in requests:
            threading.Thread(target=self.stream, args=(request,), daemon=True).start()
        return None

    def prompt_words(self, request):
        text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
        return text.reshape(-1)[0].decode().split() or ["token"]

    def describe(self, request):
        seen = {}
        for tensor in request.inputs():
            data = tensor.as_numpy()
            seen[tensor.name()] = {"datatype": str(data.dtype), "shape": list(data.shape),
                                   "values": [_value(v) for v in data.reshape(-1).tolist()]}
        return json.dumps(seen, sort_keys=True)

    def limit(self, request):
        tensor = pb_utils.get_input_tensor_by_name(request, "max_tokens")
        return int(tensor.as_numpy().reshape(-1)[0]) if tensor is not None else 8

    def words(self, request):
        """The words to answer with, one per step; None once cancelled."""
        self.record("start", request)
        words = self.prompt_words(request)
        for step in range(self.limit(request)):
            if request.is_cancelled():
                self.record("cancelled", request)
                return
            time.sleep(self.step)
            word = words[step % len(words)]
            if word == "fail":
                raise Failed(f"text_words failed at word {step + 1}")
            yield word + " "
        self.record("done", request)

    def response(self, request, text, count):
        def scalar(name, value, dtype):
            return pb_utils.Tensor(name, np.array([value], dtype=dtype))
        return pb_utils.InferenceResponse(output_tensors=[
            scalar("text_output", text.encode(), np.object_),
            scalar("num_input_tokens", len(self.prompt_words(request)), np.uint32),
            scalar("num_output_tokens", count, np.uint32)])

    def answer(self, request):
        if self.mode == "echo":
            return self.response(request, self.describe(request), 1)
        try:
            words = list(self.words(request))
        except Failed as exc:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))
        if request.is_cancelled():
            error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
            return pb_utils.InferenceResponse(error=error)
        return self.response(request, "".join(words), len(words))

    def stream(self, request):
        sender = request.get_response_sender()
        if self.mode == "echo":
            sender.send(self.response(request, self.describe(request), 1))
        else:
            try:
                for word in self.words(request):
                    sender.send(self.response(request, word, 1))
            except Failed as exc:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
