"""What model code asks of the server besides execute, under either instance kind.

MODE (BYTES) picks: "log" logs INPUT0's first value through each pb_utils.Logger call;
"thread" runs a BLS call to identity_fp32 from a thread the model starts (no parent
request to follow); "bytes" sends TEXT through identity_bytes with BLS; "stream" reads a
decoupled BLS child (repeat) from a thread the model starts. OUTPUT0 is what came back
(INPUT0 for "log"); PID is the process that ran execute.
"""

import os
import threading

import numpy as np

import triton_python_backend_utils as pb_utils


def call(model, tensors, outputs):
    return pb_utils.InferenceRequest(model_name=model, inputs=tensors,
                                     requested_output_names=outputs)


class TritonPythonModel:
    def execute(self, requests):
        return [self.one(request) for request in requests]

    def one(self, request):
        mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
        data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
        text = pb_utils.get_input_tensor_by_name(request, "TEXT")
        outputs = [pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64))]
        if mode == "log":
            self.log(f"probe {data[0]:g}")
            outputs.append(pb_utils.Tensor("OUTPUT0", data))
        elif mode == "bytes":
            result = call("identity_bytes", [pb_utils.Tensor("INPUT0", text.as_numpy())],
                          ["OUTPUT0"]).exec()
            if result.has_error():
                return pb_utils.InferenceResponse(error=result.error())
            echoed = pb_utils.get_output_tensor_by_name(result, "OUTPUT0").as_numpy()
            outputs.append(pb_utils.Tensor("TEXT_OUT", echoed))
            outputs.append(pb_utils.Tensor("OUTPUT0", data))
        else:
            found = self.in_thread(mode, data)
            if isinstance(found, pb_utils.TritonError):
                return pb_utils.InferenceResponse(error=found)
            outputs.append(pb_utils.Tensor("OUTPUT0", found))
        return pb_utils.InferenceResponse(outputs)

    @staticmethod
    def log(message):
        logger = pb_utils.Logger
        logger.log(f"{message} log", logger.INFO)
        logger.log_info(f"{message} info")
        logger.log_warn(f"{message} warn")
        logger.log_error(f"{message} error")
        logger.log_verbose(f"{message} verbose")

    def in_thread(self, mode, data):
        found = []
        target = self.stream if mode == "stream" else self.single
        worker = threading.Thread(target=lambda: found.append(target(data)))
        worker.start()
        worker.join(60)
        return found[0] if found else pb_utils.TritonError("the thread did not finish")

    @staticmethod
    def single(data):
        result = call("identity_fp32", [pb_utils.Tensor("INPUT0", data)], ["OUTPUT0"]).exec()
        if result.has_error():
            return result.error()
        return pb_utils.get_output_tensor_by_name(result, "OUTPUT0").as_numpy()

    @staticmethod
    def stream(data):
        count = np.array([int(data[0])], dtype=np.int32)
        values = []
        for part in call("repeat", [pb_utils.Tensor("INPUT0", count)],
                         ["OUTPUT0"]).exec(decoupled=True):
            if part.has_error():
                return part.error()
            out = pb_utils.get_output_tensor_by_name(part, "OUTPUT0")
            if out is not None:
                values.append(float(out.as_numpy()[0]))
        return np.array(values, dtype=np.float32)
