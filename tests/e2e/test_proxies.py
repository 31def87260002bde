"""Behind nginx and HAProxy (the configurations in deploy/), a client that leaves still
cancels its request on the replica that runs it: HTTP /infer, /generate, /generate_stream, the
OpenAI stream, and gRPC unary and stream calls. And with the setting the README warns about
turned the wrong way, the replica's model works on for nobody."""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.leaving import STOP_BOUND_S, cancel_line, http_raw_request, new_id
from tests.e2e.leaving_http import body, close
from tests.e2e.observe import Records, wait_until
from tests.e2e.proxies import (
    DEPLOY,
    NGINX_TEMPLATE,
    HAProxy,
    Nginx,
    Proxy,
    binary,
    build_replica_repository,
    render,
)
from tests.e2e.steady_load import Replica, SteadyLoad, wait_up
from tests.e2e.test_readme import readme_blocks
from tests.server_process import TritiumProcess

# Long enough that only a cancel ends the work; a wrong setting's test waits for it instead.
WORK_S = 30.0
WASTED_S = 1.5
HTTP_CELLS = [("infer", "slow"), ("generate", "slow"), ("generate_stream", "slow"),
              ("generate_stream", "slow_decoupled")]
PACKAGES = {"nginx": "nginx", "haproxy": "haproxy"}
# Long enough for HAProxy's checks (every 500 ms, 2 failures) to notice on a busy machine.
LAME_DUCK_S = 4.0


def require(name: str) -> None:
    if binary(name) is None:
        pytest.skip(f"{name} is not installed (apt-get install {PACKAGES[name]})")


@pytest.fixture(scope="module")
def record_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("proxy_records")


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory, record_dir: Path
             ) -> Iterator[list[TritiumProcess]]:
    repo = build_replica_repository(tmp_path_factory.mktemp("proxy_repo"), record_dir)
    started: list[TritiumProcess] = []
    try:
        for _ in range(2):
            started.append(TritiumProcess(repo).start())
        yield started
    finally:
        codes = [replica.stop() for replica in started]
        assert codes == [0] * len(started), [replica.log() for replica in started]


Started = TypeVar("Started", bound=Proxy)


@contextmanager
def running(make: Callable[[], Started]) -> Iterator[Started]:
    proxy = make()
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture(scope="module", params=["nginx", "haproxy"])
def proxy(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
          replicas: list[TritiumProcess]) -> Iterator[Proxy]:
    require(request.param)
    kind: type[Proxy] = Nginx if request.param == "nginx" else HAProxy
    with running(lambda: kind(tmp_path_factory.mktemp(request.param), replicas)) as started:
        yield started


def edited(old: str, new: str) -> Callable[[str], str]:
    """A configuration edit that fails loudly once the shipped file no longer says ``old``."""
    def edit(config: str) -> str:
        assert config.count(old) == 1, f"the shipped configuration lost {old!r}"
        return config.replace(old, new)
    return edit


def wait_cancel_logged(replicas: list[TritiumProcess], request_id: str, model: str) -> None:
    """One replica, whichever the proxy chose, logged the request cancelled while executing."""
    line = cancel_line(request_id, model, "executing")
    deadline = time.monotonic() + 10
    while not any(line in replica.log() for replica in replicas):
        assert time.monotonic() < deadline, [replica.log() for replica in replicas]
        time.sleep(0.01)


def assert_cancelled(records: Records, replicas: list[TritiumProcess], request_id: str,
                     model: str, left_at: float) -> None:
    stopped = records.wait_for(request_id, "cancelled")
    assert stopped - left_at < STOP_BOUND_S, f"model stopped {stopped - left_at:.3f} s late"
    assert "done" not in records.events(request_id)
    wait_cancel_logged(replicas, request_id, model)


def send_http(proxy: Proxy, route: str, model: str, request_id: str, seconds: float
              ) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.http_port), timeout=30)
    sock.sendall(http_raw_request(model, route, body(route, request_id, {"INPUT0": seconds})))
    return sock


@pytest.mark.parametrize("reset", [False, True], ids=["fin", "rst"])
@pytest.mark.parametrize(("route", "model"), HTTP_CELLS)
def test_http_client_leaving_cancels_on_the_replica(
        proxy: Proxy, replicas: list[TritiumProcess], record_dir: Path, route: str, model: str,
        reset: bool) -> None:
    records, rid = Records(record_dir / "slow.jsonl"), new_id()
    sock = send_http(proxy, route, model, rid, WORK_S)
    records.wait_for(rid, "start")
    left_at = time.monotonic()
    close(sock, reset)
    assert_cancelled(records, replicas, rid, model, left_at)


def test_openai_stream_client_leaving_cancels_on_the_replica(
        proxy: Proxy, replicas: list[TritiumProcess], record_dir: Path) -> None:
    records, rid = Records(record_dir / "text.jsonl"), new_id()
    data = json.dumps({"model": "text_stream", "prompt": "a b c", "max_tokens": 1500,
                       "stream": True}).encode()
    sock = socket.create_connection(("127.0.0.1", proxy.http_port), timeout=30)
    sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json"
                 f"\r\nX-Request-Id: {rid}\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    received = b""
    while b'"text":"a ' not in received:  # the first word went through the proxy unbuffered
        chunk = sock.recv(65536)
        assert chunk, received
        received += chunk
    left_at = time.monotonic()
    close(sock)
    assert_cancelled(records, replicas, rid, "text_stream", left_at)


def infer_input(seconds: float) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([seconds], dtype=np.float32))
    return [tensor]


def test_grpc_unary_cancel_cancels_on_the_replica(
        proxy: Proxy, replicas: list[TritiumProcess], record_dir: Path) -> None:
    records, rid = Records(record_dir / "slow.jsonl"), new_id()
    outcomes: list[Any] = []
    with grpcclient.InferenceServerClient(proxy.grpc_url) as client:
        call = client.async_infer("slow", infer_input(WORK_S),
                                  lambda **outcome: outcomes.append(outcome), request_id=rid)
        records.wait_for(rid, "start")
        left_at = time.monotonic()
        call.cancel()
        assert_cancelled(records, replicas, rid, "slow", left_at)
    assert all(outcome["result"] is None for outcome in outcomes)


def test_grpc_stream_cancel_cancels_on_the_replica(
        proxy: Proxy, replicas: list[TritiumProcess], record_dir: Path) -> None:
    records, rid = Records(record_dir / "slow.jsonl"), new_id()
    with grpcclient.InferenceServerClient(proxy.grpc_url) as client:
        client.start_stream(lambda result, error: None)
        client.async_stream_infer("slow_decoupled", infer_input(WORK_S), request_id=rid)
        records.wait_for(rid, "start")
        left_at = time.monotonic()
        client.stop_stream(cancel_requests=True)
        assert_cancelled(records, replicas, rid, "slow_decoupled", left_at)


@pytest.mark.parametrize(("name", "old", "new"), [
    ("nginx", "proxy_ignore_client_abort off;", "proxy_ignore_client_abort on;"),
    ("haproxy", "    option abortonclose\n", ""),
], ids=["nginx-proxy_ignore_client_abort-on", "haproxy-without-abortonclose"])
def test_a_wrong_setting_lets_the_model_work_for_nobody(
        tmp_path: Path, replicas: list[TritiumProcess], record_dir: Path, name: str, old: str,
        new: str) -> None:
    """The README's warning, kept true: the client leaves, the replica never hears of it."""
    require(name)
    kind = Nginx if name == "nginx" else HAProxy
    records, rid = Records(record_dir / "slow.jsonl"), new_id()
    with running(lambda: kind(tmp_path / name, replicas, edit=edited(old, new))) as wrong:
        sock = send_http(wrong, "infer", "slow", rid, WASTED_S)
        records.wait_for(rid, "start")
        close(sock)
        records.wait_for(rid, "done", timeout=WASTED_S + 10)
    assert records.events(rid) == ["start", "done"]


def test_a_rolling_restart_behind_haproxy_fails_no_request(tmp_path: Path) -> None:
    """One of two replicas restarted under steady HTTP and gRPC load: its lame duck keeps it
    serving while HAProxy's health checks take it out, so no client sees an error."""
    require("haproxy")
    repo = build_replica_repository(tmp_path / "repo", tmp_path)
    replicas: list[Replica] = []
    try:
        for _ in range(2):
            replicas.append(Replica(repo, "--lame-duck-secs", str(LAME_DUCK_S)))
        with running(lambda: HAProxy(tmp_path / "haproxy", [r.process for r in replicas])
                     ) as haproxy, SteadyLoad(haproxy, http_clients=1, grpc_clients=1) as load:
            sent = load.tally.sent
            wait_until(lambda: min(sent["HTTP"], sent["gRPC"]) >= 20, "load under way")
            offset, leaving = len(haproxy.log()), replicas[0].process
            replicas[0].restart()
            wait_up(haproxy, "replica1", offset)
            after = dict(sent)
            wait_until(lambda: min(sent["HTTP"] - after["HTTP"], sent["gRPC"] - after["gRPC"])
                       >= 20, "load after the restart")
        assert "tritium_http/replica1 is DOWN" in haproxy.log()[offset:], haproxy.log()
        assert "lame duck" in leaving.log(), leaving.log()
        assert not load.tally.failed, load.tally.reasons
    finally:
        for replica in replicas:
            replica.stop()


def test_the_readme_proxy_commands_render_what_the_tests_run(tmp_path: Path) -> None:
    """The README's block, run as written (the nginx file written here rather than to /etc,
    HAProxy asked to check its configuration rather than serve), gives the nginx
    configuration these tests render and a configuration HAProxy accepts."""
    require("haproxy")
    if binary("envsubst") is None:
        pytest.skip("envsubst is not installed (apt-get install gettext-base)")
    block = next(b for b in readme_blocks() if "envsubst" in b.text)
    rendered = tmp_path / "tritium.conf"
    script = "\n".join(block.commands).replace("/etc/nginx/conf.d/tritium.conf", str(rendered))
    script = script.replace("haproxy -f", f"{binary('haproxy')} -c -f")
    done = subprocess.run(["bash", "-e", "-c", script], cwd=DEPLOY.parent, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and "valid" in done.stdout, (done.stdout, done.stderr)
    export = next(c for c in block.commands if c.startswith("export "))
    values = dict(word.split("=", 1) for word in shlex.split(export)[1:])
    assert rendered.read_text() == render(NGINX_TEMPLATE.read_text(), values)
    assert not re.findall(r"\$\{\w+\}", rendered.read_text()), "a variable left unrendered"
