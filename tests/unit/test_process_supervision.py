"""Pure pieces of instance-process supervision: the restart schedule, exit descriptions,
``EXECUTION_ENV_PATH`` resolution, and what a child process is (argv, sys.path, forks)."""

from __future__ import annotations

import asyncio
import functools
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from tritonclient.grpc import model_config_pb2

from tests.unit.admitted import admit
from tests.unit.clock import FakeClock
from tritium.core.cancellation import CancelReason
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.request import AdmittedRequest, InferenceRequest
from tritium.core.response import InferenceResponse
from tritium.execution.backend import InstanceInfo
from tritium.execution.process import environment
from tritium.execution.process.restart import Backoff, RestartPolicy, describe_exit
from tritium.execution.process.supervisor import (
    KILL_AFTER_CANCEL,
    SupervisedInstance,
    kill_after_cancel_secs,
)


# -- restart schedule --------------------------------------------------------------------
def test_backoff_doubles_while_the_instance_keeps_dying_and_stops_at_the_cap() -> None:
    clock = FakeClock()
    backoff = Backoff(RestartPolicy(first_delay_s=0.1, factor=2, max_delay_s=1.0,
                                    stable_after_s=60), clock)
    delays = []
    for _ in range(6):
        backoff.started()
        clock.now += 1  # up for a second, then dead again
        delays.append(backoff.died())
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    assert backoff.deaths_in_a_row == 6


def test_backoff_starts_over_after_a_stable_run() -> None:
    clock = FakeClock()
    backoff = Backoff(RestartPolicy(first_delay_s=0.5, factor=3, max_delay_s=100,
                                    stable_after_s=10), clock)
    backoff.started()
    assert backoff.died() == 0.5
    backoff.started()
    assert backoff.died() == 1.5
    backoff.started()
    clock.now += 10  # stayed up long enough: the next death is a first one again
    assert backoff.died() == 0.5


def test_a_failed_start_counts_as_a_death_in_a_row() -> None:
    """An instance whose initialize() fails on restart never calls started(): no reset."""
    clock = FakeClock()
    backoff = Backoff(RestartPolicy(first_delay_s=1, factor=2, max_delay_s=100,
                                    stable_after_s=1), clock)
    backoff.started()
    clock.now += 50
    assert backoff.died() == 1
    clock.now += 50  # time passes while restarting, but it never came up
    assert backoff.died() == 2


@pytest.mark.parametrize(("code", "text"), [
    (-signal.SIGSEGV, "killed by signal SIGSEGV (11)"),
    (-signal.SIGKILL, "killed by signal SIGKILL (9)"),
    (3, "exited with code 3"),
    (0, "exited with code 0"),
    (-200, "killed by signal unknown signal (200)"),
    (None, "still running"),
])
def test_exit_descriptions_name_the_signal_or_code(code: int | None, text: str) -> None:
    assert describe_exit(code) == text


# -- EXECUTION_ENV_PATH ------------------------------------------------------------------
def _config(value: str | None, name: str = "m") -> model_config_pb2.ModelConfig:
    config = model_config_pb2.ModelConfig(name=name)
    if value is not None:
        config.parameters[environment.PARAMETER].string_value = value
    return config


def test_no_parameter_means_no_environment(tmp_path: Path) -> None:
    assert environment.configured_path(_config(None), str(tmp_path)) is None
    assert environment.resolve(_config(None), str(tmp_path)) is None


def test_the_model_directory_keyword_is_expanded_once_as_triton_does() -> None:
    """python_be.cc replaces the first "$$TRITON_MODEL_DIRECTORY" with the model's
    repository path; later occurrences stay as written."""
    value = "$$TRITON_MODEL_DIRECTORY/env.tar.gz"
    assert environment.expand_model_directory(value, "/models/m") == "/models/m/env.tar.gz"
    twice = "$$TRITON_MODEL_DIRECTORY/$$TRITON_MODEL_DIRECTORY"
    assert environment.expand_model_directory(twice, "/x") == "/x/$$TRITON_MODEL_DIRECTORY"
    assert environment.configured_path(_config(value), "/models/m") == "/models/m/env.tar.gz"


def test_a_missing_path_is_refused_in_tritons_words(tmp_path: Path) -> None:
    """pb_env.cc: "Failed to get the canonical path for <path>." when realpath fails."""
    missing = tmp_path / "nowhere"
    with pytest.raises(TritiumError) as caught:
        environment.resolve(_config(str(missing)), str(tmp_path))
    assert caught.value.message == f"Failed to get the canonical path for {missing}."


def test_a_directory_without_an_interpreter_is_refused(tmp_path: Path) -> None:
    (tmp_path / "env" / "lib").mkdir(parents=True)
    with pytest.raises(TritiumError) as caught:
        environment.resolve(_config("$$TRITON_MODEL_DIRECTORY/env", "nopy"), str(tmp_path))
    text = caught.value.message
    assert "model 'nopy'" in text and "no Python interpreter" in text and "bin/python" in text


def test_a_file_that_is_no_archive_is_refused(tmp_path: Path) -> None:
    (tmp_path / "env.tar.gz").write_bytes(b"not a tar archive at all" * 40)
    with pytest.raises(TritiumError, match="neither a directory nor a tar archive"):
        environment.resolve(_config(str(tmp_path / "env.tar.gz")), str(tmp_path))


def _fake_python(root: Path, script: str) -> Path:
    """An 'interpreter' that is a shell script: enough to test the lookup and the probe."""
    (root / "bin").mkdir(parents=True, exist_ok=True)
    python = root / "bin" / "python"
    python.write_text(f"#!/bin/sh\n{script}\n")
    python.chmod(0o755)
    return python


def test_an_interpreter_without_numpy_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    facts = {"python": "3.11", "numpy_error": "ModuleNotFoundError: No module named 'numpy'"}
    _fake_python(tmp_path / "env", f"cat <<'EOF'\n{json.dumps(facts)}\nEOF")
    with pytest.raises(TritiumError) as caught:
        environment.resolve(_config(str(tmp_path / "env")), str(tmp_path))
    assert "cannot import numpy" in caught.value.message
    assert "No module named 'numpy'" in caught.value.message
    assert "must contain numpy" in caught.value.message


def _tar_of(directory: Path, archive: Path, wrap: str = "") -> None:
    with tarfile.open(archive, "w:gz") as tar:
        for entry in sorted(directory.rglob("*")):
            tar.add(entry, arcname=os.path.join(wrap, str(entry.relative_to(directory))),
                    recursive=False)


def test_an_archive_is_extracted_once_into_a_private_cache_named_by_content(
        tmp_path: Path) -> None:
    source = tmp_path / "src"
    _fake_python(source, 'echo \'{"python": "3.11", "numpy": "9.9"}\'')
    archive = tmp_path / "model" / "env.tar.gz"
    archive.parent.mkdir()
    _tar_of(source, archive)
    cache = tmp_path / "cache"
    first = environment.resolve(_config("$$TRITON_MODEL_DIRECTORY/env.tar.gz"),
                                str(archive.parent), cache)
    assert first is not None
    assert first.root.parent == cache and first.interpreter == first.root / "bin" / "python"
    assert first.numpy == "9.9"
    assert (cache.stat().st_mode & 0o777) == 0o700
    marker = first.root / "marker"
    marker.write_text("kept")
    again = environment.resolve(_config(str(archive)), str(tmp_path), cache)
    assert again is not None and again.root == first.root and marker.exists()
    assert [p.name for p in cache.iterdir()] == [first.root.name]  # no staging left over


def test_an_archive_that_wraps_the_environment_in_one_directory_is_found(
        tmp_path: Path) -> None:
    source = tmp_path / "src"
    _fake_python(source, 'echo \'{"python": "3.11", "numpy": "1.0"}\'')
    archive = tmp_path / "wrapped.tar.gz"
    _tar_of(source, archive, wrap="myenv")
    resolved = environment.resolve(_config(str(archive)), str(tmp_path), tmp_path / "cache")
    assert resolved is not None and resolved.interpreter.parent.parent.name == "myenv"


def test_an_archive_member_outside_the_target_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "evil.tar"
    with tarfile.open(archive, "w") as tar:
        data = b"owned"
        member = tarfile.TarInfo("../escaped")
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
    with pytest.raises(TritiumError, match="cannot extract"):
        environment.resolve(_config(str(archive)), str(tmp_path), tmp_path / "cache")
    assert not (tmp_path / "escaped").exists()


def test_a_cache_others_can_write_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "src"
    _fake_python(source, "true")
    archive = tmp_path / "env.tar"
    _tar_of(source, archive)
    cache = tmp_path / "shared"
    cache.mkdir(mode=0o777)
    cache.chmod(0o777)
    with pytest.raises(TritiumError, match="writable by others"):
        environment.resolve(_config(str(archive)), str(tmp_path), cache)


def test_the_spawn_environment_activates_the_environment(tmp_path: Path) -> None:
    env = environment.ExecutionEnvironment("x", tmp_path, tmp_path / "bin" / "python",
                                           "3.11", "2.0")
    spawned = env.spawn_env({"PATH": "/usr/bin", "PYTHONPATH": "/elsewhere", "HOME": "/h"})
    assert spawned["PATH"] == f"{tmp_path}/bin:/usr/bin"
    assert spawned["VIRTUAL_ENV"] == str(tmp_path)
    assert spawned["LD_LIBRARY_PATH"] == f"{tmp_path}/lib"
    assert "PYTHONPATH" not in spawned and spawned["HOME"] == "/h"
    # The server's PYTHONPATH still reaches the child, after the environment's own paths.
    assert "/elsewhere" in spawned[environment.SERVER_PATH_ENV].split(os.pathsep)
    command = env.command("some.module", ["a", "b"])
    assert command[:2] == [str(tmp_path / "bin" / "python"), "-c"]
    assert command[3:] == ["some.module", "a", "b"]


def test_the_bootstrap_runs_the_module_like_python_dash_m(tmp_path: Path) -> None:
    (tmp_path / "probe_mod.py").write_text(textwrap.dedent("""
        import json, sys
        print(json.dumps({"name": __name__, "argv": sys.argv[1:]}))
    """))
    env = environment.ExecutionEnvironment("x", tmp_path, Path(sys.executable), "", "")
    spawned = env.spawn_env(dict(os.environ))
    spawned[environment.SERVER_PATH_ENV] += os.pathsep + str(tmp_path)
    done = subprocess.run(env.command("probe_mod", ["one", "two"]), env=spawned,
                          capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(done.stdout) == {"name": "__main__", "argv": ["one", "two"]}


# -- the supervised slot -----------------------------------------------------------------
def run_async(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))
    return run


class ScriptedProcess:
    """Stands in for an instance process: the test decides when it answers and dies."""

    pids = iter(range(1000, 2000))

    def __init__(self, on_done: Any, fail_start: bool = False):
        self.on_done = on_done
        self.fail_start = fail_start
        self.pid = next(self.pids)
        self.returncode: int | None = None
        self.batches: list[list[AdmittedRequest]] = []
        self.stopped = False
        self.is_async = False
        self._exit: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def start(self) -> None:
        if self.fail_start:
            raise TritiumError(ErrorCode.INTERNAL, "initialize failed")

    @property
    def alive(self) -> bool:
        return self.returncode is None

    def submit(self, batch: list[AdmittedRequest]) -> None:
        self.batches.append(batch)

    def answer(self, batch: list[AdmittedRequest]) -> None:
        self.on_done(self, batch, 1000, [])

    def die(self, code: int) -> None:
        self.returncode = code
        self._exit.set_result(code)

    def stop(self) -> None:
        self.stopped = True
        self.die(0)

    async def wait_stopped(self) -> None:
        await self._exit

    def exited(self) -> asyncio.Future[int]:
        return self._exit

    def kill(self) -> None:
        self.die(-signal.SIGKILL)

    def report_to(self, owner: Any, on_done: Any) -> bool:
        return False  # every done goes through the slot's own callback


class StraightProcess(ScriptedProcess):
    """Reports what it ran straight to the scheduler, as the process kind does; at its
    death it answers and reports what it held itself, through the slot's callback."""

    def __init__(self, on_done: Any, fail_start: bool = False):
        super().__init__(on_done, fail_start)
        self.straight: tuple[Any, Any] | None = None

    def report_to(self, owner: Any, on_done: Any) -> bool:
        self.straight = (owner, on_done)
        return True

    def answer(self, batch: list[AdmittedRequest]) -> None:
        assert self.straight is not None
        self.batches.remove(batch)
        owner, on_done = self.straight
        on_done(owner, batch, 1000, [])

    def die(self, code: int) -> None:
        self.returncode = code
        held, self.batches = self.batches, []
        for batch in held:
            for request in batch:
                request.stream.close_with(InferenceResponse.failure(
                    TritiumError(ErrorCode.INTERNAL, "gone")))
            self.on_done(self, batch, -1, [])
        self._exit.set_result(code)


class Slot:
    """A SupervisedInstance over scripted processes, and what it reported."""

    def __init__(self, kill_after: float | None = None, failing_starts: int = 0,
                 straight: bool = False):
        self.processes: list[ScriptedProcess] = []
        self._kind = StraightProcess if straight else ScriptedProcess
        self.done: list[tuple[list[AdmittedRequest], int]] = []
        self._failing = failing_starts
        info = InstanceInfo("m", 1, "/nowhere", "{}", "m_0", "CPU", 0)
        policy = RestartPolicy(first_delay_s=0.01, factor=2, max_delay_s=0.05)
        self.instance = SupervisedInstance(info, self._make, asyncio.get_running_loop(),
                                           self._done, policy, kill_after)

    def _make(self, on_done: Any) -> ScriptedProcess:
        fail = len(self.processes) > 0 and self._failing > 0
        if fail:
            self._failing -= 1
        process = self._kind(on_done, fail_start=fail)
        self.processes.append(process)
        return process

    def _done(self, instance: Any, batch: list[AdmittedRequest], exec_ns: int,
              woken: list[Any]) -> None:
        assert instance is self.instance
        self.done.append((batch, exec_ns))

    async def wait_restarted(self, count: int) -> None:
        async with asyncio.timeout(10):
            # The slot offers no restart event (nothing but this test would use one).
            while self.instance.restarts < count:  # noqa: ASYNC110
                await asyncio.sleep(0.005)


def _request(loop: asyncio.AbstractEventLoop, name: str = "r") -> AdmittedRequest:
    return admit(InferenceRequest(model_name="m", inputs={}, id=name), loop=loop)


def _answer(request: AdmittedRequest) -> InferenceResponse:
    items = request.stream._items
    assert len(items) == 1, items
    return items[0]


@run_async
async def test_a_dying_process_fails_its_batch_at_once_and_is_restarted(
        caplog: pytest.LogCaptureFixture) -> None:
    """Triton answers the requests of a dead stub "Stub process '<instance>' is not
    healthy." (INTERNAL); the slot is busy until a new process is up, then free again."""
    loop = asyncio.get_running_loop()
    slot = Slot()
    await slot.instance.start()
    assert slot.instance.ready
    batch = [_request(loop, "a"), _request(loop, "b")]
    slot.instance.submit(batch)
    first = slot.processes[0]
    first.die(-signal.SIGSEGV)
    await asyncio.sleep(0.001)
    assert not slot.instance.ready and slot.done == []  # busy: nothing reported yet
    for request in batch:
        answer = _answer(request)
        assert answer.error is not None and answer.final
        assert answer.error.code is ErrorCode.INTERNAL
        assert answer.error.message == "Stub process 'm_0' is not healthy."
    await slot.wait_restarted(1)
    assert slot.instance.ready and slot.instance.pid == slot.processes[1].pid
    assert slot.done == [(batch, -1)]  # the slot is back once the new process is up
    assert "killed by signal SIGSEGV (11)" in caplog.text
    assert "Stub process 'm_0' is unhealthy and it will be restarted" in caplog.text
    slot.instance.stop()
    await slot.instance.wait_stopped()


@run_async
async def test_answers_the_process_sent_before_dying_are_not_overwritten() -> None:
    loop = asyncio.get_running_loop()
    slot = Slot()
    await slot.instance.start()
    batch = [_request(loop)]
    slot.instance.submit(batch)
    process = slot.processes[0]
    ok = InferenceResponse(outputs=[], final=True)
    batch[0].stream.send_nowait(ok)
    process.die(3)  # the process kind reports the batch done as it notices the death
    process.answer(batch)
    await slot.wait_restarted(1)
    assert _answer(batch[0]) is ok
    assert slot.done == [(batch, 1000)]
    slot.instance.stop()
    await slot.instance.wait_stopped()


@run_async
async def test_a_slot_whose_starts_keep_failing_gives_up_and_answers_why(
        caplog: pytest.LogCaptureFixture) -> None:
    """After max_failed_starts failed starts in a row the slot stops retrying: it is not
    ready, and what reaches it (the queue drains to it) is answered UNAVAILABLE with the
    reason at once, instead of waiting for a restart that will not come."""
    loop = asyncio.get_running_loop()
    slot = Slot(failing_starts=100)
    await slot.instance.start()
    batch = [_request(loop, "a")]
    slot.instance.submit(batch)
    slot.processes[0].die(1)
    async with asyncio.timeout(10):
        while slot.instance.failure is None:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
    assert len(slot.processes) == 1 + RestartPolicy().max_failed_starts
    assert not slot.instance.ready
    assert slot.done == [(batch, -1)]  # the slot is free again: its queue is not held
    late = [_request(loop, "late")]
    slot.instance.submit(late)
    await asyncio.sleep(0.01)  # answered once the scheduler's hand-over is done
    answer = _answer(late[0])
    assert answer.error is not None and answer.error.code is ErrorCode.UNAVAILABLE
    assert "initialize failed" in answer.error.message
    assert "not restarted again" in caplog.text
    assert slot.done[-1] == (late, -1)
    slot.instance.stop()
    await slot.instance.wait_stopped()


@run_async
async def test_restarts_back_off_while_starts_fail_and_the_slot_recovers(
        caplog: pytest.LogCaptureFixture) -> None:
    slot = Slot(failing_starts=2)
    await slot.instance.start()
    slot.processes[0].die(1)
    await slot.wait_restarted(1)
    assert [p.fail_start for p in slot.processes] == [False, True, True, False]
    assert caplog.text.count("failed to restart: initialize failed") == 2
    assert slot.instance.ready and slot.instance.restarts == 1
    slot.instance.stop()
    await slot.instance.wait_stopped()


@run_async
async def test_a_process_that_exits_while_stopping_is_not_restarted() -> None:
    slot = Slot()
    await slot.instance.start()
    slot.instance.stop()
    await slot.instance.wait_stopped()
    assert slot.processes[0].stopped and len(slot.processes) == 1
    assert slot.instance.restarts == 0


@run_async
async def test_stopping_while_restarting_reports_the_dead_batch_and_starts_nothing() -> None:
    loop = asyncio.get_running_loop()
    slot = Slot()
    slot.instance._backoff.policy = RestartPolicy(first_delay_s=30)  # a long wait
    await slot.instance.start()
    batch = [_request(loop)]
    slot.instance.submit(batch)
    slot.processes[0].die(-signal.SIGKILL)
    await asyncio.sleep(0.01)
    slot.instance.stop()
    async with asyncio.timeout(5):
        await slot.instance.wait_stopped()
    assert len(slot.processes) == 1 and slot.done == [(batch, -1)]


@run_async
async def test_a_cancelled_batch_that_does_not_return_in_its_grace_is_killed(
        caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio.get_running_loop()
    slot = Slot(kill_after=0.05)
    await slot.instance.start()
    batch = [_request(loop, "a"), _request(loop, "b")]
    slot.instance.submit(batch)
    process = slot.processes[0]
    batch[0].cancellation.cancel(CancelReason.CLIENT_DISCONNECTED)
    await asyncio.sleep(0.15)
    assert process.returncode is None  # one request still wants its answer: no kill
    batch[1].cancellation.cancel(CancelReason.CLIENT_CANCELLED)
    await slot.wait_restarted(1)
    assert process.returncode == -signal.SIGKILL
    assert "killed by tritium" in caplog.text and KILL_AFTER_CANCEL in caplog.text
    slot.instance.stop()
    await slot.instance.wait_stopped()


@run_async
async def test_a_cancelled_batch_that_returns_in_its_grace_is_not_killed() -> None:
    loop = asyncio.get_running_loop()
    slot = Slot(kill_after=0.05)
    await slot.instance.start()
    batch = [_request(loop)]
    slot.instance.submit(batch)
    batch[0].cancellation.cancel(CancelReason.CLIENT_DISCONNECTED)
    slot.processes[0].answer(batch)
    await asyncio.sleep(0.15)
    assert slot.processes[0].returncode is None and slot.instance.restarts == 0
    slot.instance.stop()
    await slot.instance.wait_stopped()


@pytest.mark.parametrize(("value", "expected"), [(None, None), ("2.5", 2.5), ("", None)])
def test_the_kill_option_reads_seconds(value: str | None, expected: float | None) -> None:
    config = model_config_pb2.ModelConfig(name="m")
    if value is not None:
        config.parameters[KILL_AFTER_CANCEL].string_value = value
    assert kill_after_cancel_secs(config) == expected


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_the_kill_option_refuses_what_is_not_a_positive_number(value: str) -> None:
    config = model_config_pb2.ModelConfig(name="m")
    config.parameters[KILL_AFTER_CANCEL].string_value = value
    with pytest.raises(TritiumError, match="greater than 0"):
        kill_after_cancel_secs(config)


# -- what an instance process is -----------------------------------------------------------
def _run_child(script: str) -> subprocess.CompletedProcess[str]:
    """Runs ``script`` in a fresh interpreter: the at-fork hooks and sys changes under test
    must not touch the test process."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                          text=True, timeout=60, check=False)


def test_an_instance_process_has_its_own_argv_and_the_model_dirs_for_life(
        tmp_path: Path) -> None:
    done = _run_child(f"""
        import json, signal, sys
        from tritium.execution.process import death
        death.become_instance_process({str(tmp_path / "1")!r}, {str(tmp_path)!r})
        print(json.dumps({{"argv": sys.argv, "tail": sys.path[-2:],
                          "sigint": signal.getsignal(signal.SIGINT) == signal.SIG_IGN}}))
    """)
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout)
    assert facts == {"argv": [""], "tail": [str(tmp_path / "1"), str(tmp_path)], "sigint": True}


def test_a_fork_of_the_model_neither_keeps_the_link_nor_outlives_its_forker() -> None:
    """The fork's copy of the link is /dev/null (the server sees end of file when the
    instance process dies, whatever its forks do), and once the instance process is gone
    the fork exits by itself within the orphan check period."""
    done = _run_child("""
        import os, socket, stat, sys, time
        from tritium.execution.process import death
        mine, theirs = socket.socketpair()
        death.keep_links_to_self([mine.fileno()])
        reader, writer = os.pipe()
        child = os.fork()
        if child == 0:
            os.close(reader)
            kind = "null" if stat.S_ISCHR(os.fstat(mine.fileno()).st_mode) else "socket"
            os.write(writer, (kind + "\\n").encode())
            time.sleep(60)  # the orphan watch ends this once the parent is gone
            os._exit(0)
        os.close(writer)
        print(os.read(reader, 100).decode().strip(), child, flush=True)
        os._exit(0)  # the instance process dies; the fork is now an orphan
    """)
    assert done.returncode == 0, done.stderr
    kind, child = done.stdout.split()
    assert kind == "null"
    deadline = time.monotonic() + 20
    while os.path.exists(f"/proc/{child}") and _state(int(child)) != "Z":
        assert time.monotonic() < deadline, "the orphaned fork is still alive"
        time.sleep(0.05)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def test_a_child_whose_parent_is_already_gone_exits_at_once() -> None:
    done = _run_child("""
        from tritium.execution.process import death
        death.die_with_parent(1)  # "the parent" is not ours: as if it had died already
        print("still here")
    """)
    assert done.returncode == 1 and "still here" not in done.stdout
    assert "the server is gone" in done.stderr


@run_async
async def test_a_batch_for_the_spare_place_of_a_dead_process_waits_for_the_next_one() -> None:
    """A process instance takes two batches at once; when its process dies with one, the
    scheduler may still hand it another (its spare place): that one is not failed, it is
    given to the restarted process."""
    loop = asyncio.get_running_loop()
    slot = Slot()
    await slot.instance.start()
    assert slot.instance.depth > 1
    first = [_request(loop, "a")]
    slot.instance.submit(first)
    slot.processes[0].die(-signal.SIGKILL)
    await asyncio.sleep(0.001)
    second = [_request(loop, "b")]
    slot.instance.submit(second)
    assert not second[0].stream._items
    await slot.wait_restarted(1)
    assert slot.processes[1].batches == [second]
    slot.processes[1].answer(second)
    assert slot.done == [(first, -1), (second, 1000)]
    slot.instance.stop()
    await slot.instance.wait_stopped()


@run_async
async def test_a_slot_that_kills_after_a_cancel_takes_one_batch_at_a_time() -> None:
    slot = Slot(kill_after=1.0)
    await slot.instance.start()
    assert slot.instance.depth == 1
    slot.instance.stop()
    await slot.instance.wait_stopped()


@run_async
async def test_a_process_that_reports_straight_skips_the_slot_and_its_death_still_waits(
        ) -> None:
    """A process that takes ``report_to`` reports the batches it ran to the scheduler as
    the slot's; the batch its death ended comes back only once a new process is up, and
    the new one reports straight too."""
    loop = asyncio.get_running_loop()
    slot = Slot(straight=True)
    await slot.instance.start()
    first = slot.processes[0]
    ran, dying = [_request(loop, "a")], [_request(loop, "b")]
    slot.instance.submit(ran)
    slot.instance.submit(dying)
    first.answer(ran)
    assert slot.done == [(ran, 1000)] and not slot.instance._flights
    first.die(-signal.SIGKILL)
    await asyncio.sleep(0.001)
    assert slot.done == [(ran, 1000)]  # busy until restarted
    spare = [_request(loop, "spare")]
    slot.instance.submit(spare)  # not to the dead one: it waits for the next
    assert first.batches == []
    await slot.wait_restarted(1)
    assert slot.done == [(ran, 1000), (dying, -1)]
    assert slot.processes[1].batches == [spare]
    slot.processes[1].answer(spare)
    later = [_request(loop, "c")]
    slot.instance.submit(later)
    slot.processes[1].answer(later)
    assert slot.done[-1] == (later, 1000)
    slot.instance.stop()
    await slot.instance.wait_stopped()


@run_async
async def test_a_slot_that_kills_after_a_cancel_keeps_every_done_for_itself() -> None:
    slot = Slot(kill_after=1.0, straight=True)
    await slot.instance.start()
    process = slot.processes[0]
    assert isinstance(process, StraightProcess)
    assert process.straight is None  # each batch's watch ends in the slot
    slot.instance.stop()
    await slot.instance.wait_stopped()
