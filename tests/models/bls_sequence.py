"""BLS requests carrying sequence flags, as Triton's QA ``bls`` model sends them.

Each request runs two sequences at once (correlation ids 1000 and 1001) against the
``sequence_accumulator`` model: START with 1000, then 0..9 with no flags, then END with
2000. The parameter ``decoupled`` ("true") makes the middle requests
``exec(decoupled=True)``. OUTPUT0 (BYTES [1]): "ok", or the first failure's text.
"""

import json
import threading

import numpy as np

import triton_python_backend_utils as pb_utils

START = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
END = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END


def _sum(value, correlation_id, flags=0, decoupled=False):
    request = pb_utils.InferenceRequest(
        model_name="sequence_accumulator",
        inputs=[pb_utils.Tensor("INPUT0", np.array([value], dtype=np.int32))],
        requested_output_names=["SUM"], flags=flags, correlation_id=correlation_id)
    if decoupled:
        responses = request.exec(decoupled=True)
        response = next(responses)
        if next(responses, None) is not None:
            raise AssertionError("a second response where one was expected")
    else:
        response = request.exec()
    if response.has_error():
        raise AssertionError(response.error().message())
    return int(pb_utils.get_output_tensor_by_name(response, "SUM").as_numpy()[0])


def _sequence(correlation_id, decoupled, failures):
    try:
        total = _sum(1000, correlation_id, START)
        for value in range(10):
            expected = total + value
            total = _sum(value, correlation_id, decoupled=decoupled)
            if total != expected:
                raise AssertionError(f"sum {total}, expected {expected}")
        if _sum(2000, correlation_id, END) != total + 2000:
            raise AssertionError("the final sum is wrong")
    except Exception as exc:  # reported to the client, not raised on this thread
        failures.append(f"{correlation_id}: {exc}")


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.decoupled = parameters.get("decoupled", {}).get("string_value") == "true"

    def execute(self, requests):
        return [self._run() for _ in requests]

    def _run(self):
        failures = []
        threads = [threading.Thread(target=_sequence, args=(cid, self.decoupled, failures))
                   for cid in (1000, 1001)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        text = "; ".join(failures) or "ok"
        return pb_utils.InferenceResponse(
            [pb_utils.Tensor("OUTPUT0", np.array([text.encode()], dtype=np.object_))])
