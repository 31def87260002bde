"""What one HTTP/1.1 listener lets a peer hold: bytes, time and connections."""

from __future__ import annotations

from dataclasses import dataclass

from tritium.core.descriptors import default_connection_cap


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """Per-connection bounds; each one, when hit, ends in a clear status or a close.

    Defaults follow common practice: nginx's client_header_timeout / client_body_timeout /
    send_timeout for the waits, Kestrel's minimum request body data rate for the pace.
    """

    max_header_bytes: int = 64 * 1024
    max_body_bytes: int = 64 * 1024 * 1024
    max_chunks: int = 65536
    # The whole request head must arrive within this long of its first byte.
    header_timeout_s: float = 30.0
    keepalive_timeout_s: float = 75.0
    # The longest the body may pause between two reads...
    body_timeout_s: float = 60.0
    # ...and, past the grace period, the slowest average pace it may keep.
    min_body_rate: float = 240.0  # bytes/s
    body_rate_grace_s: float = 5.0
    # The longest a peer may leave its response unread once the write buffer is full.
    send_timeout_s: float = 60.0
    # Requests parsed ahead of the one being served, by count and by body bytes, before the
    # connection stops reading.
    max_pipeline: int = 32
    max_pipeline_bytes: int = 1024 * 1024
    # Open connections on the listener; None: a share of the open-file limit.
    max_connections: int | None = None

    def connection_cap(self) -> int:
        """The connection cap in force: the configured one, else a share of RLIMIT_NOFILE."""
        if self.max_connections is not None:
            return self.max_connections
        return default_connection_cap()

    def shortest_timeout(self) -> float:
        return min(self.header_timeout_s, self.keepalive_timeout_s, self.body_timeout_s,
                   self.body_rate_grace_s, self.send_timeout_s)
