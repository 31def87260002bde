"""Calls to the server from processes model code forks (a ``multiprocessing`` pool whose
workers run BLS, as Triton's ``test_multiprocess`` does).

Only the instance process holds the link to the server. Each fork gets a socketpair to its
instance process instead: the fork's server link speaks the same messages over it (its
tensors inline: it has no arena of its own; replies' tensors it reads from the arena it
inherited), and a relay thread of the instance process forwards its calls to the server
under ids of its own and the replies back, untouched.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

from tritium.execution.process import messages as msg
from tritium.execution.process.channel import ChildLink
from tritium.execution.process.codec import FrameError, FrameReader, decode, encode
from tritium.execution.process.shm import InlineWriter

_pair: list[socket.socket] = []  # made before a fork, taken by both sides after it


def install(link: ChildLink, rebind: Any) -> None:
    """In the instance process: every fork from now on gets a link through this one;
    ``rebind(new_link)`` points the fork's server link at it."""
    def before() -> None:
        _pair[:] = list(socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM))

    def in_parent() -> None:
        ours, theirs = _pair
        _pair.clear()
        theirs.close()
        threading.Thread(target=_relay, args=(link, ours), daemon=True,
                         name="tritium-fork-relay").start()

    def in_child() -> None:
        ours, theirs = _pair
        _pair.clear()
        ours.close()
        forked = ChildLink(theirs)
        forked.writer = InlineWriter()
        forked.reader = link.reader  # the inherited mapping of the server's arena
        rebind(forked)

    import os

    os.register_at_fork(before=before, after_in_parent=in_parent, after_in_child=in_child)


class RelayedCall:
    """A fork's call as the instance's link holds it: replies go back to the fork."""

    def __init__(self, fork: _Fork, call_id: int) -> None:
        self.fork = fork
        self.call_id = call_id  # the fork's own id for it

    def forward(self, message: msg.Reply | msg.ReplyError) -> None:
        if isinstance(message, msg.Reply):
            self.fork.send(msg.Reply(self.call_id, message.payload, message.buffers,
                                     message.final))
        else:
            self.fork.send(msg.ReplyError(self.call_id, message.error))


class _Fork:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.lock = threading.Lock()
        self.ids: dict[int, int] = {}  # the fork's call id -> the link's

    def send(self, message: Any) -> None:
        with self.lock, contextlib.suppress(OSError):
            self.sock.sendall(encode(message))


def _relay(link: ChildLink, sock: socket.socket) -> None:
    """Forward a fork's calls until it closes its end."""
    fork = _Fork(sock)
    frames = FrameReader()
    try:
        while data := sock.recv(1 << 16):
            frames.feed(data)
            for body in frames.bodies(1 << 30):
                message = decode(body)
                if type(message) is msg.Call:
                    fork.ids[message.call_id] = link.relay(
                        message, RelayedCall(fork, message.call_id))
                elif type(message) is msg.CallCancel:
                    relayed = fork.ids.get(message.call_id)
                    if relayed is not None:
                        link.send(msg.CallCancel(relayed))
    except (OSError, FrameError):
        pass
    finally:
        for relayed in fork.ids.values():
            with contextlib.suppress(OSError):
                link.send(msg.CallCancel(relayed))
        sock.close()
