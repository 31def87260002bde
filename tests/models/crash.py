"""Dies in execute() the way model code really dies, chosen by INPUT0[0]; answers otherwise.

INPUT0[0]: 0 answers OUTPUT0 = [pid of this process] (so a test tells a restarted instance
from the old one), 1 segfaults (a NULL write through ctypes), 2 calls os._exit(3), 3 sends
itself SIGKILL, 4 allocates past an RLIMIT_AS it sets itself, in C++ (operator new throws
std::bad_alloc through C frames: "terminate called", SIGABRT, as a native extension that
runs out of memory dies), 5 raises (an ordinary model error: the instance survives).
"""

import ctypes
import os
import resource
import signal

import numpy as np

import triton_python_backend_utils as pb_utils


def _address_space() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


def _allocate_past_limit():
    limit = _address_space() + (64 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
    new = ctypes.CDLL("libstdc++.so.6")._Znwm  # operator new(size_t)
    new.restype, new.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    new(1 << 32)


CRASHES = {
    1: lambda: ctypes.memset(0, 1, 64),
    2: lambda: os._exit(3),
    3: lambda: os.kill(os.getpid(), signal.SIGKILL),
    4: _allocate_past_limit,
}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0])
            if mode in CRASHES:
                CRASHES[mode]()
            if mode == 5:
                raise pb_utils.TritonModelException("an ordinary error")
            out = pb_utils.Tensor("OUTPUT0", np.array([os.getpid()], dtype=np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
