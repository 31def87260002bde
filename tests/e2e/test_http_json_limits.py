"""A big JSON /infer body whose data does not fit its shape is refused as soon as the parse
passes the shape, not after hundreds of MiB of Python numbers are built from it."""

from __future__ import annotations

import time

import requests

from tests.e2e.bystander import Bystander, health_url, peak_rss_bytes
from tests.server_process import TritiumProcess

INSTANCE_KINDS = ("thread",)

MIB = 1 << 20


def test_data_past_its_shape_is_refused_early(server: TritiumProcess) -> None:
    """60 MiB of JSON numbers for a shape of 10 (it took 3.4 s and 436 MiB to refuse):
    400 with Triton's words, the server's peak memory grows by little more than the body
    (held once), and an unrelated client is served meanwhile."""
    numbers = b",".join([b"0.5"] * 15_000_000)
    body = (b'{"inputs":[{"name":"INPUT0","shape":[10],"datatype":"FP32","data":['
            + numbers + b"]}]}")
    assert 55 * MIB < len(body) < 64 * MIB
    before = peak_rss_bytes(server.pid)
    bystander = Bystander(health_url(server.http_url))
    with bystander.watching() as latencies:
        started = time.monotonic()
        reply = requests.post(f"http://{server.http_url}/v2/models/identity_fp32/infer",
                              data=body, headers={"Content-Type": "application/json"},
                              timeout=120)
        elapsed = time.monotonic() - started
    bystander.close()
    assert reply.status_code == 400
    assert reply.json()["error"] == ("Unable to parse 'data': Shape does not match true shape "
                                     "of 'data' field")
    grown = peak_rss_bytes(server.pid) - before
    # The body is held once, in the buffer it arrived in (never joined or copied to be
    # parsed), and the numbers it holds are not built.
    assert grown < 1.3 * len(body), f"peak memory grew {grown / MIB:.0f} MiB"
    assert elapsed < 20
    bystander.assert_served(latencies)
