"""The clocks of one HTTP connection: how long each side may keep the other waiting.

Times are read from the listener's coarse clock and judged by its periodic sweep, never by a
timer per request, so the hot path only ever stores a float.
"""

from __future__ import annotations

from tritium.frontends.http.limits import HttpLimits

# After a rejection the connection is half-closed and drained this long at most, so the
# answer is read before the close (a close with unread input resets the connection).
LINGER_S = 2.0
# A connection accepted but never handed its transport is given up after the header timeout
# (which bounds TLS handshakes too) and this much more.
CONNECT_GRACE_S = 1.0


class Pacing:
    """Progress marks of one connection and the judgement of each wait against its limit."""

    __slots__ = ("_body", "_body_moved", "_body_seen", "_limits", "_linger_since",
                 "_stalled_since", "_stalled_size", "waiting_since")

    def __init__(self, limits: HttpLimits, now: float):
        self._limits = limits
        # Since when the server has been waiting on the peer: the last response was written
        # or the peer caught up on reading. Earlier time was the server's, not the peer's.
        self.waiting_since = now
        self._body = self._body_moved = now  # when the body being watched began
        self._body_seen = 0
        self._stalled_since = now
        self._stalled_size = 0
        self._linger_since: float | None = None

    # -- the peer sending ------------------------------------------------------------------

    def never_connected(self, now: float) -> bool:
        return now - self.waiting_since >= self._limits.header_timeout_s + CONNECT_GRACE_S

    def idle_too_long(self, now: float) -> bool:
        return now - self.waiting_since >= self._limits.keepalive_timeout_s

    def head_too_slow(self, now: float, head_started: float) -> bool:
        return now - max(head_started, self.waiting_since) >= self._limits.header_timeout_s

    def body_too_slow(self, now: float, started: float, received: int) -> str | None:
        """Why the body begun at ``started`` is too late, or None while it keeps its pace.

        The reader only stamps ``started``: progress is noticed here, at the sweep.
        """
        limits = self._limits
        if started != self._body:  # a new body: its clock starts afresh
            self._body, self._body_moved, self._body_seen = started, started, 0
        if received != self._body_seen:
            self._body_seen, self._body_moved = received, now
        if now - max(self._body_moved, self.waiting_since) >= limits.body_timeout_s:
            return f"timed out reading the request body: no data for {limits.body_timeout_s:g} s"
        paced = now - max(started, self.waiting_since) - limits.body_rate_grace_s
        if paced > 0 and received < limits.min_body_rate * paced:
            return (f"timed out reading the request body: it arrives slower than "
                    f"{limits.min_body_rate:g} bytes/s")
        return None

    # -- the peer reading ------------------------------------------------------------------

    def write_paused(self, now: float, buffered: int) -> None:
        self._stalled_since, self._stalled_size = now, buffered

    def send_stalled(self, now: float, buffered: int) -> bool:
        """While writes are paused: True once the peer has read nothing for send_timeout_s."""
        if buffered < self._stalled_size:
            self._stalled_since, self._stalled_size = now, buffered
            return False
        return now - self._stalled_since >= self._limits.send_timeout_s

    def linger(self, now: float) -> None:
        self._linger_since = now

    def lingered_out(self, now: float) -> bool:
        return self._linger_since is not None and now - self._linger_since >= LINGER_S
