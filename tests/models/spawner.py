"""Starts children every way model code does, then answers OUTPUT0 = [pid of this process].

INPUT0[0] == 0: start them (subprocess.Popen, the same in a session of its own, a double
fork that leaves an orphan, multiprocessing fork and spawn), each sleeping for minutes.
INPUT0[0] == 1: exit this process at once (os._exit), leaving them behind.
"""

import multiprocessing
import os
import subprocess
import sys
import time

import numpy as np

import triton_python_backend_utils as pb_utils


def _sleep():
    time.sleep(300)


def _double_fork():
    if os.fork() == 0:
        if os.fork() == 0:
            os.execv("/bin/sleep", ["sleep", "301"])
        os._exit(0)


class TritonPythonModel:
    def initialize(self, args):
        self.children = []

    def execute(self, requests):
        responses = []
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0])
            if mode == 1:
                os._exit(3)
            self.children.append(subprocess.Popen(["sleep", "302"]))
            self.children.append(subprocess.Popen(["sleep", "303"], start_new_session=True))
            self.children.append(subprocess.Popen(
                [sys.executable, "-c", "import os, time; os.setsid(); time.sleep(304)"]))
            _double_fork()
            for method in ("fork", "spawn"):
                process = multiprocessing.get_context(method).Process(target=_sleep)
                process.start()
                self.children.append(process)
            out = pb_utils.Tensor("OUTPUT0", np.array([os.getpid()], dtype=np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
