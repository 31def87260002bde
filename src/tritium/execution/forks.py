"""A fork of the server made by model code (``os.fork``, ``multiprocessing``'s fork
start method, from a thread instance) holds none of the server's listening sockets: it
would keep the ports bound after the server ends, and the next server could not start.

The server's other descriptors stay as they are (model code may use its own); no event
loop runs in the fork, so it serves nothing either way.
"""

from __future__ import annotations

import os
import socket

_installed = False


def install() -> None:
    """Once per process: every fork from now on drops the listening sockets it inherits."""
    global _installed
    if not _installed:
        _installed = True
        os.register_at_fork(after_in_child=drop_listeners)


def drop_listeners() -> None:
    """In a fresh fork: each listening socket's descriptor is pointed at /dev/null (not
    closed: the socket objects of the copied server still own the numbers)."""
    devnull = -1
    for fd in _listeners():
        if devnull < 0:
            devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, fd, inheritable=False)
    if devnull >= 0:
        os.close(devnull)


def _listeners() -> list[int]:
    found: list[int] = []
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for name in names:
        fd = int(name)
        try:
            probe = socket.socket(fileno=fd)
        except OSError:
            continue  # not a socket (or already gone)
        try:
            if probe.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                found.append(fd)
        except OSError:
            pass
        finally:
            probe.detach()
    return found
