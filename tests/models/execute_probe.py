"""Records every execute() call: one JSON line per call to the file named by the model
parameter ``record_file``, {"instance": ..., "requests": [{name: [shape, datatype,
values]}]} (BYTES values decoded as latin-1), then copies INPUT0 to OUTPUT0. With the
parameter ``fail`` set, every response is an error "An Error Occurred". Decoupled
configs get their response and FINAL through the response sender."""

import json
import threading

import numpy as np

import triton_python_backend_utils as pb_utils

_lock = threading.Lock()


def _values(array):
    if array.dtype == np.object_:
        return [bytes(v).decode("latin-1") for v in array.reshape(-1)]
    return array.reshape(-1).tolist()


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        parameters = config["parameters"]
        self.record_file = parameters["record_file"]["string_value"]
        self.fail = "fail" in parameters
        self.decoupled = config.get("model_transaction_policy", {}).get("decoupled", False)
        self.instance = args["model_instance_name"]

    def execute(self, requests):
        seen = [{t.name(): [list(t.shape()), t.triton_dtype(), _values(t.as_numpy())]
                 for t in request.inputs()} for request in requests]
        with _lock, open(self.record_file, "a") as f:
            f.write(json.dumps({"instance": self.instance, "requests": seen}) + "\n")
        responses = [self._response(request) for request in requests]
        if not self.decoupled:
            return responses
        for request, response in zip(requests, responses, strict=True):
            sender = request.get_response_sender()
            sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None

    def _response(self, request):
        if self.fail:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError("An Error Occurred"))
        tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor("OUTPUT0", tensor.as_numpy())])
