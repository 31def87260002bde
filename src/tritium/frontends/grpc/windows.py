"""HTTP/2 flow control, one object per direction, and the server's budget of request bytes.

``SendWindow`` is the credit a peer granted us; ``RecvWindow`` the credit we granted it, which
a peer that sends more than it was given overruns (a FLOW_CONTROL_ERROR). Credit is returned
only as bytes are consumed, so a peer that sends faster than the server takes its messages
stalls on its own window instead of filling the server's memory.
"""

from __future__ import annotations

from collections.abc import Callable

from tritium.frontends.grpc.http2 import MAX_WINDOW


class WindowError(Exception):
    """A peer broke flow control: it overran a window or grew one past 2^31-1."""


class SendWindow:
    """Bytes we may still send; may go negative when the peer shrinks its initial window."""

    __slots__ = ("size",)

    def __init__(self, size: int):
        self.size = size

    def grow(self, increment: int) -> None:
        """Add a WINDOW_UPDATE's credit (the connection's hot path inlines this)."""
        if self.size + increment > MAX_WINDOW:
            raise WindowError("window grown past 2^31-1")
        self.size += increment

    def spend(self, count: int) -> None:
        self.size -= count


class RecvWindow:
    """Bytes the peer may still send; ``consume`` says what credit to return now.

    Credit is returned in batches of at least half the window, so a stream of small
    messages costs one WINDOW_UPDATE per half window, not one per message.
    """

    __slots__ = ("available", "size", "unreturned")

    def __init__(self, size: int):
        self.size = size
        self.available = size
        self.unreturned = 0

    def receive(self, count: int) -> None:
        """Count ``count`` bytes received (the connection's hot path inlines this)."""
        if count > self.available:
            raise WindowError(self.overrun_text(count))
        self.available -= count

    def overrun_text(self, count: int) -> str:
        return f"peer sent {count} bytes with {self.available} of window left"

    def consume(self, count: int) -> int:
        """``count`` received bytes are no longer held; returns the increment to announce
        (0 while the batch is small)."""
        self.unreturned += count
        if self.unreturned < self.size // 2:
            return 0
        increment, self.unreturned = self.unreturned, 0
        self.available += increment
        return increment


class ByteBudget:
    """Request bytes a part of the server may have coming at it or held at once.

    A connection reserves credit here before it grants it to its peer, and keeps it reserved
    while the bytes sent against it are held; it is released as they are consumed. So the
    bytes all peers can make the server hold never exceed ``limit`` (plus the 64 KiB that
    HTTP/2 grants every connection before the server says anything). A connection that finds
    the budget spent waits, and is retried, oldest first, as others release.

    A budget may be a share of a ``parent``: one peer address's share of the server's.
    Bytes held in it are held in the parent too, and its room is the smaller of the two.
    One level only: a share's parent is the server's budget, which has none.
    """

    def __init__(self, limit: int, parent: ByteBudget | None = None):
        if parent is not None and parent.parent is not None:
            raise ValueError("a budget's share cannot itself be shared")
        self.limit = limit
        self.parent: ByteBudget | None = parent
        self.held = 0
        self._waiting: dict[object, Callable[[], None]] = {}

    @property
    def ceiling(self) -> int:
        """The most this budget can ever hold: its limit, or its parent's if smaller."""
        parent = self.parent
        return self.limit if parent is None else min(self.limit, parent.ceiling)

    def room(self) -> int:
        own = max(0, self.limit - self.held)
        return own if self.parent is None else min(own, self.parent.room())

    def take(self, count: int) -> None:
        """Count ``count`` bytes as held, whether or not there was room."""
        self.held += count
        if self.parent is not None:
            self.parent.take(count)

    def reserve(self, count: int) -> bool:
        if count > self.room():
            return False
        self.take(count)
        return True

    def release(self, count: int) -> None:
        self.held -= count
        parent = self.parent
        if parent is not None:  # ByteBudget.release of the parent, without the call
            parent.held -= count
            if parent._waiting:
                parent._retry_waiters()
        if self._waiting:
            self._retry_waiters()

    def _retry_waiters(self) -> None:
        for key, retry in list(self._waiting.items()):
            if self.room() <= 0:
                break
            if self._waiting.pop(key, None) is not None:
                retry()

    def wait(self, key: object, retry: Callable[[], None]) -> None:
        """Call ``retry`` once bytes are released where they ran out (``retry`` may call
        ``wait`` again)."""
        if self.parent is not None and self.held < self.limit:
            self.parent.wait(key, retry)  # this share has room: the server's is spent
        else:
            self._waiting[key] = retry

    def forget(self, key: object) -> None:
        self._waiting.pop(key, None)
        if self.parent is not None:
            self.parent.forget(key)


class PeerBudgets:
    """Each peer address's share of the server's budget, while it has connections open:
    one peer, however many connections it opens, holds at most ``share`` bytes."""

    def __init__(self, server: ByteBudget, share: int):
        self.server = server
        self.share = share
        self._peers: dict[str, tuple[ByteBudget, int]] = {}  # address -> budget, connections

    def join(self, address: str) -> ByteBudget:
        budget, count = self._peers.get(address) or (ByteBudget(self.share, self.server), 0)
        self._peers[address] = (budget, count + 1)
        return budget

    def leave(self, address: str) -> None:
        budget, count = self._peers[address]
        if count > 1:
            self._peers[address] = (budget, count - 1)
        else:
            del self._peers[address]

    def __len__(self) -> int:
        return len(self._peers)
