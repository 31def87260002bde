"""Probes of the model API: MODE (BYTES) picks one; TEXT (BYTES) carries a JSON report.

bls_bytes: a BLS call to identity_fp32 whose names are all bytes; OUTPUT0 is its answer.
helper: imports helper.py (next to this file) inside execute; TEXT is helper.NAME.
argv: TEXT is sys.argv, and argparse parses it without leaving.
unittest: unittest.main("model") finds this file's test case through sys.path.
writable: INPUT0 as numpy is written in place and crosses DLPack both ways; OUTPUT0 is
INPUT0 + 1 and TEXT reports the flags seen.
"""

import argparse
import json
import sys
import unittest

import numpy as np

import triton_python_backend_utils as pb_utils


class ModelApiTest(unittest.TestCase):
    def test_sees_an_empty_argv(self):
        self.assertEqual(sys.argv, [""])


def bls_bytes(data):
    request = pb_utils.InferenceRequest(
        model_name=b"identity_fp32",
        request_id=b"child-id",
        inputs=[pb_utils.Tensor(b"INPUT0", data)],
        requested_output_names=[b"OUTPUT0"],
    )
    response = request.exec()
    if response.has_error():
        raise pb_utils.TritonModelException(response.error().message())
    out = pb_utils.get_output_tensor_by_name(response, "OUTPUT0")
    return out.as_numpy(), {"request_model_name": request.model_name(),
                            "request_id": request.request_id()}


def helper_name(data):
    import helper

    return data, {"helper": helper.NAME}


def argv(data):
    parsed = argparse.ArgumentParser().parse_args()
    return data, {"argv": sys.argv, "parsed": vars(parsed)}


def run_unittest(data):
    test = unittest.main("model", exit=False)
    return data, {"run": test.result.testsRun, "ok": test.result.wasSuccessful()}


def writable(data_tensor):
    array = data_tensor.as_numpy()
    report = {"writeable": bool(array.flags.writeable)}
    array += 1  # in place, as models do with their inputs
    through = np.from_dlpack(data_tensor)
    report["shares_memory"] = bool(np.shares_memory(through, array))
    back = pb_utils.Tensor.from_dlpack("OUTPUT0", data_tensor.to_dlpack())
    return back.as_numpy().copy(), report


class TritonPythonModel:
    def execute(self, requests):
        return [self.one(request) for request in requests]

    def one(self, request):
        mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
        tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
        if mode == "writable":
            out, report = writable(tensor)
        else:
            probe = {"bls_bytes": bls_bytes, "helper": helper_name, "argv": argv,
                     "unittest": run_unittest}[mode]
            out, report = probe(tensor.as_numpy())
        text = np.array([json.dumps(report).encode()], dtype=np.object_)
        return pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", out),
                                           pb_utils.Tensor("TEXT", text)])
