"""An instance's guardian: ``python -m tritium.execution.process.guardian``.

The server starts this small process; it forks the instance process (the stub) and makes
sure every process model code starts, however it starts it (``subprocess.Popen`` with or
without a session of its own, ``multiprocessing`` fork or spawn, double forks), ends
with the instance and with the server:

* it is a child subreaper (``PR_SET_CHILD_SUBREAPER``): a descendant whose parent dies is
  reparented here, not to the system's init, so the whole tree stays below it;
* when the instance process ends, however it ends, it kills what is left of the tree and
  exits with the instance's status (a signal death is re-raised, so the server reads the
  same cause);
* when the server dies, SIGKILL included, the kernel signals it (``PR_SET_PDEATHSIG``) and
  it does the same; the server ends an instance by signalling it (SIGTERM) too.

Only the guardian's own SIGKILL escapes this (the instance still dies with it, through its
own PR_SET_PDEATHSIG, but its descendants are left to the system's init): the server never
sends it one.

It imports nothing heavy and runs no model code: its fork of the interpreter stays small.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
STUB_MODULE = "tritium.execution.process.stub"
PARENT_PID_ENV = "TRITIUM_PARENT_PID"  # who the guardian, then the instance, must outlive
FDS_ENV = "TRITIUM_PROCESS_FDS"  # the instance's descriptors: the guardian keeps none

_ending = False


def main() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    signal.signal(signal.SIGTERM, _end)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server stops its instances itself
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    server = os.environ.get(PARENT_PID_ENV, "")
    if server.isdigit() and os.getppid() != int(server):
        return 1  # the server died before the signal was armed
    os.environ[PARENT_PID_ENV] = str(os.getpid())
    instance = os.fork()
    if instance == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        import runpy

        runpy.run_module(STUB_MODULE, run_name="__main__", alter_sys=True)
        return 0
    for entry in os.environ.get(FDS_ENV, "").split(","):  # name=fd (channel.FDS_ENV)
        fd = entry.partition("=")[2]
        if fd.isdigit():
            os.close(int(fd))
    status = _wait_for(instance)
    _kill_tree()
    return _exit_like(status)


def _end(signum: int, frame: object) -> None:
    global _ending
    _ending = True
    _kill_tree()


def _wait_for(instance: int) -> int:
    """Reap every child reparented here until the instance process ends; its status."""
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 0
        except InterruptedError:
            continue
        if pid == instance:
            return status


def _kill_tree() -> None:
    """SIGKILL every descendant, again until none is left (one may fork meanwhile)."""
    for _ in range(100):
        tree = _descendants(os.getpid())
        if not tree:
            return
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _reap()
        time.sleep(0.001)


def _reap() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def _descendants(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != b"Z":
            parents[int(entry)] = int(fields[1])
    found: list[int] = []
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier}
        found.extend(frontier)
    return found


def _exit_like(status: int) -> int:
    """The instance's exit code, or its death by signal re-raised here."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        return 128 + sig
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main())
