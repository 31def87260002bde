"""CPU a traced request costs the tracer, in process: the tree of one identity inference
(the frontend's span, the model's, its compute span, Triton's 13 timestamps) recorded N
times, in each mode, then written out (the trace file) or exported (OTLP/HTTP to a sink in
this process that accepts everything). Process CPU time, so the exporter thread counts.

    python bench/tracing.py [--requests 5000]

``bench/instructions.py --trace MODE`` measures the same in a whole server, per inference.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from instructions import OtlpSink

from tritium.core import tracing
from tritium.tracing import ServerTracer, TraceSettings


def one(tracer: ServerTracer) -> None:
    root = tracing.begin(tracer, "identity", {}, tracing.HTTP_EVENTS)
    assert root is not None
    model = root.spawn("identity", 1, "", time.monotonic_ns())
    model.event(tracing.QUEUE_START, time.monotonic_ns())
    for name in (tracing.COMPUTE_START, tracing.COMPUTE_INPUT_END,
                 tracing.COMPUTE_OUTPUT_START, tracing.COMPUTE_END):
        model.event(name, time.monotonic_ns())
    model.end(None, time.monotonic_ns())
    tracing.sending(root, tracing.HTTP_EVENTS)
    tracing.finish(root, tracing.HTTP_EVENTS, True)


def measure(flags: list[str], requests: int) -> float:
    """CPU µs per traced request, recording and writing/exporting included."""
    tracer = ServerTracer(TraceSettings.from_flags(["level=TIMESTAMPS", "rate=1", *flags]))
    for _ in range(200):
        one(tracer)
    start = time.process_time()
    for _ in range(requests):
        one(tracer)
    tracer.close()
    return (time.process_time() - start) / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=5000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        triton = measure([f"triton,file={scratch}/trace.json"], args.requests)
    print(f"triton          {triton:7.1f} µs CPU per traced request", flush=True)
    # A queue that holds the run, so no span is dropped (the default 2048 would be).
    otel = measure(["mode=opentelemetry", f"opentelemetry,url={OtlpSink.shared().url}",
                    f"opentelemetry,bsp_max_queue_size={4 * args.requests}"], args.requests)
    print(f"opentelemetry   {otel:7.1f} µs CPU per traced request (export included)",
          flush=True)


if __name__ == "__main__":
    main()
