"""The wire work of one BLS round trip, in one process: a child request (FP32[16]) encoded
into its Call frame and decoded and checked as the server does, its response encoded into
a Reply frame and decoded and checked as the instance process does. Prints µs per round
trip (best of 7). For a count that does not wander, run it under callgrind twice with
different ``--trips`` and divide the difference:

    python bench/bls_wire.py [--trips 20000]
    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python bench/bls_wire.py --trips 4200 --once
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from tritium.core.request import InferenceRequest
from tritium.core.response import InferenceResponse
from tritium.core.types import DataType, Tensor
from tritium.execution.process import messages as msg
from tritium.execution.process.codec import convert, decode, encode
from tritium.execution.process.wire import (
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)


def _data() -> np.ndarray:
    return np.ones(16, np.float32)


REQUEST = InferenceRequest(model_name="identity_fp32",
                           inputs={"INPUT0": Tensor("INPUT0", DataType.FP32, (16,), _data())})
RESPONSE = InferenceResponse(outputs=[Tensor("OUTPUT0", DataType.FP32, (16,), _data())])


def trip() -> None:
    payload, buffers = encode_request(REQUEST)
    call = decode(encode(msg.Call(1, "bls.exec", payload, msg.EMPTY, [1]))[4:])
    decode_request(convert(msg.BlsRequest, call.payload), buffers)
    answer, buffers = encode_response(RESPONSE)
    reply = decode(encode(msg.Reply(1, answer, msg.EMPTY, True))[4:])
    decode_response(reply.payload, buffers)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trips", type=int, default=20000)
    parser.add_argument("--once", action="store_true", help="one pass, no timing")
    args = parser.parse_args()
    if args.once:
        for _ in range(args.trips):
            trip()
        return
    for _ in range(2000):
        trip()
    best = float("inf")
    for _ in range(7):
        started = time.perf_counter_ns()
        for _ in range(args.trips):
            trip()
        best = min(best, (time.perf_counter_ns() - started) / args.trips / 1000)
    print(f"BLS wire work (request and response, encoded, decoded, checked): "
          f"{best:.2f} µs per round trip (best of 7 x {args.trips})")


if __name__ == "__main__":
    main()
