"""Attacks the server through its own instance channel, as compromised model code could.

INPUT0[0] picks the attack, written raw onto the socket that links this instance process
to the server (its only socket): 0 answers OUTPUT0 = [pid of this process]; 1 a pickle
that would run code in the server; 2 a call whose tensors lie at an offset of 2**40 in
the arena; 3 a frame announcing 4 GiB; 4 a thread sending tiny valid frames forever;
5 and up a BLS call through its own server link whose payload is not a BLS request (see
BLS_PAYLOADS), answered with the call's error as this request's.
"""

import os
import pickle
import stat
import threading
import time

import msgspec
import numpy as np

import triton_python_backend_utils as pb_utils


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch /tmp/tritium-hostile-pickle-ran",))


def _channel():
    for name in os.listdir("/proc/self/fd"):
        try:
            if stat.S_ISSOCK(os.fstat(int(name)).st_mode):
                return int(name)
        except OSError:
            continue
    raise RuntimeError("no channel socket")


def _frame(body):
    return len(body).to_bytes(4, "little") + body


def _flood(fd):
    frame = _frame(msgspec.msgpack.encode([15, 999_999])) * 256  # CallCancel of no call
    while True:
        os.write(fd, frame)


ATTACKS = {
    1: lambda fd: os.write(fd, _frame(pickle.dumps((14, _Payload())))),
    2: lambda fd: os.write(fd, _frame(msgspec.msgpack.encode(
        [14, 424242, "log", None, [1 << 40, [["x", 8, [4], 0, 16]]], []]))),
    3: lambda fd: os.write(fd, ((4 << 30) - 1).to_bytes(4, "little") + b"\0" * 4096),
    4: lambda fd: threading.Thread(target=_flood, args=(fd,), daemon=True).start(),
}


_HEADER = ["INPUT0", "FP32", [4]]
BLS_PAYLOADS = {
    5: ["identity", "1", "", [_HEADER], None, {}, 0, 0, 0, None],  # a version of a str
    6: ["identity"],  # missing fields
    7: ["identity", None, "", [["INPUT0", "FP32", ["4"]]], None, {}, 0, 0, 0, None],
    8: ["identity", None, "", [["INPUT0", "FP32", [1 << 40]]], None, {}, 0, 0, 0, None],
}


def _bls_call(payload):
    """The call's error (``exec`` sends only well-formed requests: this goes around it)."""
    from tritium.backends.python import scope

    link = scope.current_link()._bls._link
    try:
        link.call("bls.exec", payload, [memoryview(bytes(16))]).result()
    except Exception as exc:
        return str(exc)
    return "the call was accepted"


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0])
            if mode in BLS_PAYLOADS:
                error = pb_utils.TritonError(_bls_call(BLS_PAYLOADS[mode]))
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            if mode in ATTACKS:
                ATTACKS[mode](_channel())
                if mode != 4:
                    time.sleep(30)  # the server ends this process first
            out = pb_utils.Tensor("OUTPUT0", np.array([os.getpid()], dtype=np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
