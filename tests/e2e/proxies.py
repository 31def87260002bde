"""nginx and HAProxy as real processes on loopback, in front of tritium replicas.

Each runs the configuration shipped in deploy/: nginx's template rendered as envsubst would
render it (only the named variables), HAProxy's file as is, with its addresses in the
environment. Everything they write goes under a temporary prefix; each is stopped by PID.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from tests.server_process import TritiumProcess
from tests.zoo import DECOUPLED, _parameter, _tensor, add_model

DEPLOY = Path(__file__).resolve().parent.parent.parent / "deploy"
NGINX_TEMPLATE = DEPLOY / "nginx" / "tritium.conf.template"
HAPROXY_CONFIG = DEPLOY / "haproxy" / "tritium.cfg"
# Debian installs both under /usr/sbin, which is not on every user's PATH.
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])
START_S = 20.0
VARIABLE = re.compile(r"\$\{([A-Za-z_]\w*)\}|\$([A-Za-z_]\w*)")
TEXT_IO = (_tensor("input", "text_input", "BYTES", "1")
           + _tensor("input", "max_tokens", "INT32", "1", " optional: true")
           + _tensor("output", "text_output", "BYTES", "1"))


def binary(name: str) -> str | None:
    return shutil.which(name, path=SEARCH_PATH)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def build_replica_repository(repo: Path, record_dir: Path) -> Path:
    """slow and slow_decoupled (tests/models/slow.py), a decoupled text model for the OpenAI
    stream and identity for steady load; the recording models write into ``record_dir``."""
    tensors = _tensor("input", "INPUT0", "FP32", "1") + _tensor("output", "OUTPUT0", "FP32", "1")
    record = _parameter("record_file", f"{record_dir}/slow.jsonl")
    add_model(repo, "slow", "slow", tensors + record + "instance_group [{ count: 2 }]\n")
    add_model(repo, "slow_decoupled", "slow",
              DECOUPLED + tensors + record + "instance_group [{ count: 2 }]\n")
    add_model(repo, "text_stream", "text_words",
              DECOUPLED + TEXT_IO + _parameter("record_file", f"{record_dir}/text.jsonl"))
    add_model(repo, "identity", "identity",
              "max_batch_size: 8\n" + _tensor("input", "INPUT0", "FP32", "-1")
              + _tensor("output", "OUTPUT0", "FP32", "-1") + "instance_group [{ count: 2 }]\n")
    return repo


def replica_addresses(replicas: list[TritiumProcess]) -> dict[str, str]:
    """The TRITIUM_* variables the shipped configurations read."""
    addresses = {}
    for number, replica in enumerate(replicas, start=1):
        addresses[f"TRITIUM_HTTP_{number}"] = replica.http_url
        addresses[f"TRITIUM_GRPC_{number}"] = replica.grpc_url
    return addresses


def render(template: str, values: dict[str, str]) -> str:
    """envsubst with a list of variables: ``$NAME`` or ``${NAME}`` for those names, every
    other ``$`` (nginx's own variables) left as it is."""
    def value(found: re.Match[str]) -> str:
        return values.get(found.group(1) or found.group(2), found.group(0))
    return VARIABLE.sub(value, template)


class Proxy:
    """A proxy process listening on free loopback ports: ``http_url``, ``grpc_url``."""

    name = ""

    def __init__(self, prefix: Path, replicas: list[TritiumProcess]):
        self.prefix = prefix
        self.prefix.mkdir(parents=True, exist_ok=True)
        self.http_port, self.grpc_port = free_port(), free_port()
        self.values = {"LISTEN_HTTP": f"127.0.0.1:{self.http_port}",
                       "LISTEN_GRPC": f"127.0.0.1:{self.grpc_port}",
                       **replica_addresses(replicas)}
        self.log_path = prefix / f"{self.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    def start(self) -> Proxy:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log, env=self.environment())
        for port in (self.http_port, self.grpc_port):
            self._wait_listening(port)
        return self

    def _wait_listening(self, port: int) -> None:
        deadline = time.monotonic() + START_S
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited: {self.log()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                pass
            assert time.monotonic() < deadline, f"{self.name} not listening on {port}: {self.log()}"
            time.sleep(0.02)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


class Nginx(Proxy):
    """nginx in the foreground with its own prefix; ``edit`` changes the rendered
    configuration (to show what a wrong setting does)."""

    name = "nginx"

    def __init__(self, prefix: Path, replicas: list[TritiumProcess],
                 edit: Callable[[str], str] | None = None):
        super().__init__(prefix, replicas)
        site = render(NGINX_TEMPLATE.read_text(), self.values)
        (prefix / "tritium.conf").write_text(edit(site) if edit else site)
        (prefix / "nginx.conf").write_text(self.main_config())

    def main_config(self) -> str:
        # Temp paths under the prefix: the package's defaults are root-owned.
        temp = "\n".join(f"    {kind}_temp_path {self.prefix}/{kind}_temp;"
                         for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        # As root, workers would switch to "nobody", who cannot enter a private temp dir.
        user = "user root;\n" if os.geteuid() == 0 else ""
        return (f"{user}daemon off;\nworker_processes 1;\npid {self.prefix}/nginx.pid;\n"
                f"error_log {self.log_path} notice;\nevents {{ worker_connections 1024; }}\n"
                f"http {{\n    access_log off;\n{temp}\n"
                f"    include {self.prefix}/tritium.conf;\n}}\n")

    def command(self) -> list[str]:
        nginx = binary("nginx")
        assert nginx is not None
        return [nginx, "-p", f"{self.prefix}/", "-c", f"{self.prefix}/nginx.conf",
                "-e", str(self.log_path)]


class HAProxy(Proxy):
    """HAProxy in the foreground (-db) on the shipped file, addresses from the environment;
    with ``edit``, on an edited copy of it."""

    name = "haproxy"

    def __init__(self, prefix: Path, replicas: list[TritiumProcess],
                 edit: Callable[[str], str] | None = None):
        super().__init__(prefix, replicas)
        self.config = HAPROXY_CONFIG
        if edit is not None:
            self.config = prefix / "tritium.cfg"
            self.config.write_text(edit(HAPROXY_CONFIG.read_text()))

    def command(self) -> list[str]:
        haproxy = binary("haproxy")
        assert haproxy is not None
        return [haproxy, "-db", "-f", str(self.config)]

    def environment(self) -> dict[str, str]:
        return {**os.environ, **self.values}
