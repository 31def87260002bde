"""What an instance process is, as Triton's stub is one: its own ``sys.argv``, the model's
directories on ``sys.path`` for its whole life, forks of its own, and no life after the
server's.

Runs in the child only (``tritium.execution.process.stub`` calls ``become_instance_process``
first thing, and ``parent_gone`` when its link to the server reads end of file). A child
must not outlive the server however the server ends, SIGKILL included, so two things watch:
the kernel (``PR_SET_PDEATHSIG``: SIGKILL when the parent dies) and the link's end of file
(the kernel closes the server's end of the socket when it dies, on any platform).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import NoReturn

from tritium.backends.python import model_argv

# Set by the server in the child's environment: the pid the child must outlive.
PARENT_PID_ENV = "TRITIUM_PARENT_PID"
# And the cores model code may use ("0,1"): the child inherits the mask and scheduling
# policy of the server thread that spawned it, which placement keeps on one home core.
CORES_ENV = "TRITIUM_MODEL_CORES"
_PR_SET_PDEATHSIG = 1
# How often a process forked by model code (a multiprocessing worker) checks that the
# instance process that forked it is still there.
ORPHAN_CHECK_S = 0.5

_link_fds: tuple[int, ...] = ()


def become_instance_process(version_dir: str, model_dir: str,
                            link_fds: Sequence[int] = ()) -> None:
    """Make this process a model's own, as Triton's stub is; call before importing model.py.

    ``link_fds`` are the descriptors of the link to the server: processes the model forks
    (``multiprocessing``) get them replaced by /dev/null, so that only this process talks
    to the server and the server sees end of file the moment this process dies.
    """
    die_with_parent(_expected_parent())
    use_model_cores(os.environ.pop(CORES_ENV, ""))
    # Ctrl-C in a terminal signals the whole process group; the server handles it and
    # stops its instances in order, so the child must not die of it mid-execute.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    model_argv.install()
    # Triton's stub appends these before importing the model and never takes them away.
    sys.path.append(version_dir)
    sys.path.append(model_dir)
    keep_links_to_self(link_fds)


def die_with_parent(parent_pid: int | None) -> None:
    """SIGKILL this process when its parent dies (Linux), and exit now if it already has."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            errno = ctypes.get_errno()
            print(f"tritium instance: prctl(PR_SET_PDEATHSIG) failed: {os.strerror(errno)}",
                  file=sys.stderr)
    # The parent may have died between the fork and the prctl: then the signal never comes.
    if parent_pid is not None and os.getppid() != parent_pid:
        parent_gone()


def use_model_cores(cores_text: str) -> None:
    """Every thread of this process may run on ``cores_text``'s cores, under the ordinary
    policy: model code here is what placement lets run anywhere, and instances of one
    model must not share the server's home core (they would not run in parallel)."""
    cores = {int(core) for core in cores_text.split(",") if core.strip().isdigit()}
    if not cores or not hasattr(os, "sched_setaffinity"):
        return
    for task in os.listdir("/proc/self/task"):
        tid = int(task)
        try:
            os.sched_setaffinity(tid, cores)
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
        except OSError:
            pass  # a thread that just ended, or a sandbox that refuses: run as placed


def parent_gone() -> NoReturn:
    """The server is gone (its end of the link closed, or the process it was has died).

    Nothing is left to answer to: exit at once, without ``finalize`` (Triton's stub, on
    "Non-graceful termination detected", exits the same way), so a model stuck in its own
    code cannot keep the process alive.
    """
    try:
        print("tritium instance: the server is gone; exiting", file=sys.stderr, flush=True)
    finally:
        os._exit(1)


def keep_links_to_self(link_fds: Sequence[int]) -> None:
    """Processes forked from here neither inherit the link to the server nor outlive us."""
    global _link_fds
    _link_fds = tuple(link_fds)
    for fd in _link_fds:
        # Not across exec either (a model's subprocess.Popen(close_fds=False)).
        os.set_inheritable(fd, False)
    os.register_at_fork(after_in_child=_forked_by_model)


def _forked_by_model() -> None:
    """In a process model code forked (``os.fork``, ``multiprocessing``)."""
    if _link_fds:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in _link_fds:
            # Replaced, not closed: the socket object still owns the number, and a close
            # of a number reused meanwhile would close some other file of the fork.
            os.dup2(devnull, fd)
        os.close(devnull)
    _watch_forker(os.getppid())


def _watch_forker(forker: int) -> None:
    """Exit once the process that forked this one is gone.

    A thread that polls, not PR_SET_PDEATHSIG: that signal follows the *thread* that
    forked, and model code may start its multiprocessing pool from a thread that ends.
    """
    def watch() -> None:
        stop = threading.Event()
        while not stop.wait(ORPHAN_CHECK_S):
            if os.getppid() != forker:
                os._exit(1)

    threading.Thread(target=watch, name="tritium-orphan-watch", daemon=True).start()


def _expected_parent() -> int | None:
    text = os.environ.pop(PARENT_PID_ENV, "")
    return int(text) if text.isdigit() else None
