"""Every command and code block in the README, run against the bundled example repository, so
the README cannot drift from what the server does.

Each fenced block is sorted by what it holds: shell commands (each line must be one this file
knows how to check), Python run as a program, model configuration parsed as ``config.pbtxt``,
or server log lines that the command before them must make the server write. A block of none of
these kinds fails the first test, so a new README block comes with its check.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tests.certificates import make_pki
from tests.server_process import TritiumProcess
from tritium.cli import parse_config
from tritium.config import BUNDLED_REPOSITORY

README = Path(__file__).resolve().parents[2] / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
SERVE = ("tritium serve", "python -m tritium serve", "tritonserver")
# Commands a test cannot run as written, each with why and what checks it instead.
NOT_RUN = {
    "pip install": "CI installs the project exactly so (.ci/run)",
    "python -m pytest": "this is that run",
    "apt-get install": "installs the Debian tools that build the image, as root",
    "deploy/image/": "builds and runs the image as root (CI does not); test_deploy_consistency.py "
                     "checks the scripts and the Containerfile against the CLI and manifests",
    "podman run": "needs a container runtime; deploy/image/prove.sh runs the image without one",
    "kubectl": "needs a cluster (and KServe); test_deploy_schemas.py renders the kustomize base "
               "and validates every manifest",
    "export LISTEN_HTTP=": "test_proxies.py runs the proxy block, then both proxies on its files",
    "envsubst ": "test_proxies.py runs the proxy block, then both proxies on its files",
    "haproxy -f": "test_proxies.py runs the proxy block, then both proxies on its files",
    "python bench/": "benchmarks print figures; bench/README.md",
}
STREAM_SECONDS = 2.0  # how long a "press ctrl-C" stream runs before the client leaves


@dataclass(frozen=True)
class Block:
    lang: str
    text: str
    line: int

    @property
    def commands(self) -> list[str]:
        """Shell commands: continuations joined, comments and blank lines dropped."""
        joined = re.sub(r"\\\n\s*", " ", self.text)
        commands = []
        for raw in joined.splitlines():
            command = raw.split(" #", 1)[0].strip().removesuffix("&").strip()
            if command and not command.startswith("#"):
                commands.append(command)
        return commands

    @property
    def leaves(self) -> bool:
        """The block tells the reader to interrupt it."""
        return "ctrl-c" in self.text.lower()

    @property
    def kind(self) -> str | None:
        if self.lang == "bash":
            return "shell" if all(_command_kind(c) for c in self.commands) else None
        if self.lang == "python":
            return "python"
        lines = self.text.strip().splitlines()
        if lines and all(re.match(r"(INFO|WARNING|ERROR) tritium\.", x) for x in lines):
            return "log"
        if lines and lines[0].startswith(("parameters", "instance_group", "name:",
                                          "model_metrics")):
            return "config"
        return None


def _command_kind(command: str) -> str | None:
    if command.startswith(SERVE):
        return "serve"
    if command.startswith("curl "):
        return "curl"
    if any(command.startswith(prefix) for prefix in NOT_RUN):
        return "not run"
    return None


def readme_blocks() -> list[Block]:
    text = README.read_text()
    return [Block(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1)
            for m in FENCE.finditer(text)]


def blocks_of(kind: str) -> list[Block]:
    return [block for block in readme_blocks() if block.kind == kind]


def block_id(block: Block) -> str:
    return f"README.md:{block.line}"


def serve_argv(command: str) -> list[str]:
    """The flags of a serve command line, after its program (and ``serve``) words."""
    words = shlex.split(command)
    start = 1 if words[0] == "tritonserver" else words.index("serve") + 1
    return words[start:]


def log_patterns(block: Block) -> list[re.Pattern[str]]:
    """A README log line as a pattern: its numbers and elisions may differ run to run."""
    patterns = []
    for line in block.text.strip().splitlines():
        escaped = re.escape(line)
        escaped = re.sub(r"\d+", r"\\d+", escaped).replace("…", ".*")
        patterns.append(re.compile(escaped))
    return patterns


def wait_for_pattern(server: TritiumProcess, pattern: re.Pattern[str], start: int,
                     timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not any(pattern.search(line) for line in server.lines[start:]):
        assert time.monotonic() < deadline, f"no log line like {pattern.pattern!r}:\n" + \
            "\n".join(server.lines[start:])
        time.sleep(0.05)


@pytest.fixture(scope="module")
def bundled() -> Iterator[TritiumProcess]:
    server = TritiumProcess(BUNDLED_REPOSITORY).start(timeout=120)
    yield server
    assert server.stop() == 0, server.log()


def run_curl(command: str, server: TritiumProcess, leaves: bool) -> str:
    command = command.replace("localhost:8000", f"127.0.0.1:{server.http_port}")
    if leaves:  # the reader's ctrl-C: the client goes away mid-stream
        command += f" --max-time {STREAM_SECONDS}"
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == (28 if leaves else 0), (command, done.stdout, done.stderr)
    return done.stdout


def test_every_block_has_a_check() -> None:
    unchecked = [block_id(b) for b in readme_blocks() if b.kind is None]
    assert not unchecked, f"README blocks this test cannot check: {unchecked}"


@pytest.mark.parametrize("block", blocks_of("shell"), ids=block_id)
def test_serve_command_lines_parse(block: Block, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    make_pki(tmp_path)  # server.crt, server.key, ca.crt for the TLS examples
    (tmp_path / "src" / "tritium").mkdir(parents=True)
    (tmp_path / "src" / "tritium" / "example_repository").symlink_to(BUNDLED_REPOSITORY)
    monkeypatch.chdir(tmp_path)
    for command in block.commands:
        if _command_kind(command) != "serve":
            continue
        argv = serve_argv(command)
        if argv == ["--help"]:
            continue  # checked by the flag table's own tests
        for placeholder in ("/path/to/models", "/mnt/models"):  # the reader's repository
            argv = [word.replace(placeholder, str(BUNDLED_REPOSITORY)) for word in argv]
        if command.startswith("tritonserver"):
            config = parse_config(argv, "tritonserver")
        else:
            config = parse_config(["serve", *argv])
        assert config.model_repositories, command


@pytest.mark.e2e
@pytest.mark.parametrize("block", [b for b in blocks_of("shell")
                                   if any(_command_kind(c) == "curl" for c in b.commands)],
                         ids=block_id)
def test_curl_commands(block: Block, bundled: TritiumProcess, tmp_path: Path) -> None:
    serves = [c for c in block.commands if _command_kind(c) == "serve"]
    server = bundled
    if serves and serve_argv(serves[0]):  # the block starts a server of its own
        server = TritiumProcess(BUNDLED_REPOSITORY, *serve_argv(serves[0])).start(timeout=120)
    try:
        start = len(server.lines)
        for command in block.commands:
            if _command_kind(command) != "curl":
                continue
            out = run_curl(command, server, block.leaves)
            if block.leaves:
                assert "data:" in out, out
            else:
                assert '"error"' not in out, out
        following = next_block(block)
        if following is not None and following.kind == "log":
            for pattern in log_patterns(following):
                wait_for_pattern(server, pattern, start)
        elif block.leaves:
            wait_for_pattern(server, re.compile("cancelled after"), start)
    finally:
        if server is not bundled:
            assert server.stop() == 0, server.log()


def next_block(block: Block) -> Block | None:
    later = [b for b in readme_blocks() if b.line > block.line]
    return later[0] if later else None


@pytest.mark.e2e
@pytest.mark.parametrize("block", blocks_of("python"), ids=block_id)
def test_python_blocks(block: Block, bundled: TritiumProcess) -> None:
    code = block.text.replace("localhost:8000", f"127.0.0.1:{bundled.http_port}")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("block", blocks_of("config"), ids=block_id)
def test_config_snippets_parse(block: Block) -> None:
    config = model_config_pb2.ModelConfig()
    text_format.Parse(block.text, config)
    assert config.ByteSize() > 0
