"""Uses a multiprocessing.Pool of its own, as models that parallelise preprocessing do.

initialize() starts the pool (fork: the workers are copies of this process). execute()
squares INPUT0 in the workers and answers OUTPUT0, and writes the workers' pids and this
process's pid to the file named by the model parameter ``record_file`` (one JSON line),
so a test can check where the workers live and that none outlives the server.
"""

import json
import multiprocessing
import os

import numpy as np

import triton_python_backend_utils as pb_utils


def _square(value):
    return value * value, os.getpid(), os.getppid()


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.record_file = config["parameters"]["record_file"]["string_value"]
        self.pool = multiprocessing.Pool(2)

    def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            results = self.pool.map(_square, [float(v) for v in values])
            with open(self.record_file, "a") as f:
                f.write(json.dumps({"pid": os.getpid(), "ppid": os.getppid(),
                                    "workers": sorted({r[1] for r in results}),
                                    "worker_parents": sorted({r[2] for r in results})}) + "\n")
            out = pb_utils.Tensor("OUTPUT0", np.array([r[0] for r in results], dtype=np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses

    def finalize(self):
        self.pool.terminate()
        self.pool.join()
