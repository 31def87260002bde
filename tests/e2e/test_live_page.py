"""Triton's CPU gauges on /metrics, and the live page on the metrics port: its state while
requests queue, execute and are cancelled, its restriction, and what a real browser shows."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient

from tests.e2e.leaving import http_raw_request, new_id
from tests.e2e.observe import Records, wait_until
from tests.server_process import TritiumProcess
from tests.zoo import _parameter, _tensor, add_model

IO = _tensor("input", "INPUT0", "FP32", "1") + _tensor("output", "OUTPUT0", "FP32", "1")
CPU_FAMILIES = ("nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes")


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritiumProcess]:
    repo = tmp_path_factory.mktemp("watched")
    records = tmp_path_factory.mktemp("watched_records")
    add_model(repo, "identity", "identity", IO)
    add_model(repo, "slow", "slow", IO + _parameter("record_file", f"{records}/slow.jsonl"))
    server = TritiumProcess(repo, "--metrics-interval-ms", "200").start()
    server.records = Records(records / "slow.jsonl")  # type: ignore[attr-defined]
    yield server
    assert server.stop() == 0


def base(server: TritiumProcess) -> str:
    return server.metrics_url.removesuffix("/metrics")


def state(server: TritiumProcess) -> dict[str, Any]:
    answer = requests.get(f"{base(server)}/live/state", timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.json()


def model_row(snapshot: dict[str, Any], name: str) -> dict[str, Any]:
    return next(row for row in snapshot["models"] if row["name"] == name)


def latest_rps(server: TritiumProcess, name: str) -> float:
    series = model_row(state(server), name)["series"]
    return float(series[-1]["rps"]) if series else 0.0


def cancellation(server: TritiumProcess, request_id: str) -> dict[str, Any] | None:
    return next((row for row in state(server)["cancellations"]
                 if row["request_id"] == request_id), None)


def send(server: TritiumProcess, request_id: str, seconds: float) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
    body = f'{{"id": "{request_id}", "INPUT0": {seconds}}}'.encode()
    sock.sendall(http_raw_request("slow", "generate", body))
    return sock


def gauges(server: TritiumProcess) -> dict[str, float]:
    text = requests.get(server.metrics_url, timeout=10).text
    return {name: float(value) for name, value in
            re.findall(r"^(nv_cpu_\w+) (\S+)$", text, re.MULTILINE)}


def test_cpu_gauges_read_the_machine(watched: TritiumProcess) -> None:
    wait_until(lambda: gauges(watched).get("nv_cpu_memory_total_bytes", 0) > 0,
               "the first CPU reading")
    found = gauges(watched)
    assert set(found) == set(CPU_FAMILIES)
    meminfo = Path("/proc/meminfo").read_text()
    total_kb = int(re.search(r"^MemTotal:\s+(\d+) kB", meminfo, re.MULTILINE)[1])  # type: ignore[index]
    assert found["nv_cpu_memory_total_bytes"] == total_kb * 1024
    assert 0 < found["nv_cpu_memory_used_bytes"] < found["nv_cpu_memory_total_bytes"]
    assert 0.0 <= found["nv_cpu_utilization"] <= 1.0


@pytest.fixture(scope="module")
def cancelled(watched: TritiumProcess) -> dict[str, str]:
    """One request cancelled while executing (its client left) and one while queued behind
    it; the live state is checked while both are held."""
    records: Records = watched.records  # type: ignore[attr-defined]
    holder, waiter = new_id(), new_id()
    held = send(watched, holder, 30.0)
    records.wait_for(holder, "start")
    queued = send(watched, waiter, 30.0)
    wait_until(lambda: model_row(state(watched), "slow")["pending"] == 1, "a queued request")
    row = model_row(state(watched), "slow")
    assert (row["pending"], row["executing"], row["in_flight"]) == (1, 1, 2)
    assert row["instances"] == [{"name": "slow_0", "kind": "thread", "state": "ready",
                                 "restarts": 0}]
    queued.close()
    wait_until(lambda: cancellation(watched, waiter) is not None, "the queued cancellation")
    held.close()
    records.wait_for(holder, "cancelled")
    wait_until(lambda: (cancellation(watched, holder) or {}).get("stop_ms") is not None,
               "the executing request's stop")
    return {"executing": holder, "queued": waiter}


def test_state_lists_cancellations_with_reason_stage_and_stop_delay(
        watched: TritiumProcess, cancelled: dict[str, str]) -> None:
    executing = cancellation(watched, cancelled["executing"])
    queued = cancellation(watched, cancelled["queued"])
    assert executing is not None and queued is not None
    assert (executing["model"], executing["version"]) == ("slow", 1)
    assert (executing["reason"], executing["stage"]) == ("CLIENT_DISCONNECTED", "executing")
    assert 0 <= executing["stop_ms"] < 5000  # the model polls every millisecond
    assert (queued["reason"], queued["stage"], queued["stop_ms"]) == (
        "CLIENT_DISCONNECTED", "queued", None)
    rows = state(watched)["cancellations"]
    assert [r["time"] for r in rows] == sorted((r["time"] for r in rows), reverse=True)
    assert model_row(state(watched), "slow")["in_flight"] == 0


def test_state_has_throughput_and_latency_history(watched: TritiumProcess) -> None:
    client = httpclient.InferenceServerClient(watched.http_url)
    tensor = httpclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    for _ in range(20):
        client.infer("identity", [tensor])
    wait_until(lambda: sum(p["rps"] for p in model_row(state(watched), "identity")["series"])
               > 0, "throughput in the history")
    series = model_row(state(watched), "identity")["series"]
    busy = [p for p in series if p["rps"] > 0]
    assert busy and all(p["latency_ms"] > 0 for p in busy)
    assert [p["t"] for p in series] == sorted(p["t"] for p in series)


def test_page_is_one_self_contained_file(watched: TritiumProcess) -> None:
    answer = requests.get(f"{base(watched)}/live", timeout=10)
    assert answer.status_code == 200
    assert answer.headers["Content-Type"].startswith("text/html")
    assert re.search(r"<(script|link|img)[^>]+(src|href)=", answer.text) is None
    assert requests.post(f"{base(watched)}/live", timeout=10).status_code == 405
    assert requests.get(f"{base(watched)}/live/other", timeout=10).status_code == 404


def test_restricted_page_and_no_cpu_gauges(tmp_path: Path) -> None:
    add_model(tmp_path, "identity", "identity", IO)
    server = TritiumProcess(tmp_path, "--allow-cpu-metrics", "false",
                            "--http-restricted-api", "live:live-key=open sesame").start()
    try:
        url = base(server)
        for path in ("/live", "/live/state"):
            refused = requests.get(url + path, timeout=10)
            assert refused.status_code == 403
            assert refused.json() == {"error": "This API is restricted, expecting header "
                                               "'live-key'"}
            allowed = requests.get(url + path, headers={"live-key": "open sesame"}, timeout=10)
            assert allowed.status_code == 200
        assert requests.get(url + "/live/state", headers={"live-key": "open"},
                            timeout=10).status_code == 403
        metrics = requests.get(server.metrics_url, timeout=10)
        assert metrics.status_code == 200 and "nv_inference_request_success" in metrics.text
        assert "nv_cpu_" not in metrics.text
    finally:
        assert server.stop() == 0


# -- in a real browser ---------------------------------------------------------------------
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    # Virtual time runs the page's polling timers fast, and waits for each fetch.
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--user-data-dir={profile}", "--virtual-time-budget=5000", *args],
        capture_output=True, text=True, timeout=120, check=True)


class Load:
    """Requests to ``identity`` in a loop on a thread, until stopped."""

    def __init__(self, server: TritiumProcess):
        self._client = httpclient.InferenceServerClient(server.http_url)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.sent = 0

    def _run(self) -> None:
        tensor = httpclient.InferInput("INPUT0", [1], "FP32")
        tensor.set_data_from_numpy(np.ones(1, dtype=np.float32))
        while not self._stop.is_set():
            self._client.infer("identity", [tensor])
            self.sent += 1

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install "
                                             "chromium)")
def test_browser_shows_models_traffic_and_cancellations(
        watched: TritiumProcess, cancelled: dict[str, str], tmp_path: Path) -> None:
    page = f"{base(watched)}/live"
    with Load(watched) as load:
        wait_until(lambda: load.sent > 20 and latest_rps(watched, "identity") > 0,
                   "traffic in the latest interval", timeout=20)
        dom = chromium(tmp_path / "profile", "--dump-dom", page).stdout
        screenshot = tmp_path / "live.png"
        chromium(tmp_path / "profile", "--window-size=1400,900", f"--screenshot={screenshot}",
                 page)
    assert int(re.search(r'data-updates="(\d+)"', dom)[1]) >= 1, dom  # type: ignore[index]
    assert 'class="chip live"' in dom
    identity = re.search(r'<tr data-model="identity".*?</tr>', dom, re.DOTALL)
    assert identity is not None and "READY" in identity[0] and "identity_0 · thread" in identity[0]
    succeeded = re.search(r'<td class="num success">(\d+)</td>', identity[0])
    assert succeeded is not None and int(succeeded[1]) > 0, identity[0]
    # The charts draw a line for each model with traffic in the window.
    throughput = re.search(r'<svg id="throughput".*?</svg>', dom, re.DOTALL)
    assert throughput is not None and "<polyline" in throughput[0]
    assert "identity v1" in dom
    executing = re.search(rf'<tr[^>]*>(?:(?!</tr>).)*{cancelled["executing"]}.*?</tr>', dom,
                          re.DOTALL)
    assert executing is not None
    assert "CLIENT_DISCONNECTED" in executing[0] and " ms</td>" in executing[0]
    queued = re.search(rf'<tr[^>]*>(?:(?!</tr>).)*{cancelled["queued"]}.*?</tr>', dom, re.DOTALL)
    assert queued is not None and "never ran" in queued[0]
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert screenshot.stat().st_size > 10_000  # a rendered page, not a blank one
