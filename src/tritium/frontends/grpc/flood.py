"""Budgets for frames that cost the server work but carry nothing: a peer that spends one
is calmed down with GOAWAY ENHANCE_YOUR_CALM (as nginx, Go's net/http2 and grpc-core do)."""

from __future__ import annotations

from dataclasses import dataclass


class RateBudget:
    """A token bucket: ``burst`` events at once, refilled at ``rate`` per second."""

    __slots__ = ("_at", "_tokens", "burst", "rate")

    def __init__(self, rate: float, burst: float, now: float):
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._at = now

    def spend(self, now: float) -> bool:
        """Take one token; False once the bucket is empty."""
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


@dataclass(frozen=True, slots=True)
class FloodLimits:
    # Streams the client resets (or opens and we refuse), per second and at once: the
    # "rapid reset" attack opens and cancels streams faster than any real client.
    resets_per_s: float = 200.0
    resets_burst: float = 1000.0
    # DATA frames with no bytes and no END_STREAM, and SETTINGS frames.
    empty_frames_per_s: float = 20.0
    empty_frames_burst: float = 200.0
    settings_per_s: float = 20.0
    settings_burst: float = 200.0
    # grpc-core's ping policy (tritonserver's --grpc-http2-max-ping-strikes and
    # --grpc-http2-min-recv-ping-interval-without-data).
    max_ping_strikes: int = 2
    min_ping_interval_s: float = 300.0


class FloodGuard:
    """One connection's budgets; each ``allow_*`` is False when the peer is flooding."""

    def __init__(self, limits: FloodLimits, now: float):
        self.limits = limits
        self._resets = RateBudget(limits.resets_per_s, limits.resets_burst, now)
        self._empty = RateBudget(limits.empty_frames_per_s, limits.empty_frames_burst, now)
        self._settings = RateBudget(limits.settings_per_s, limits.settings_burst, now)
        self._last_ping: float | None = None
        self._strikes = 0

    def allow_reset(self, now: float) -> bool:
        return self._resets.spend(now)

    def allow_empty_frame(self, now: float) -> bool:
        return self._empty.spend(now)

    def allow_settings(self, now: float) -> bool:
        return self._settings.spend(now)

    def allow_ping(self, now: float) -> bool:
        """A ping sooner than the minimum interval after the last, with no reply data sent
        in between, is a strike; more strikes than allowed is abuse."""
        last, self._last_ping = self._last_ping, now
        if last is not None and now - last < self.limits.min_ping_interval_s:
            self._strikes += 1
        return self._strikes <= self.limits.max_ping_strikes

    def data_sent(self) -> None:
        """Headers or data went out: pings since are the peer measuring a live call."""
        self._strikes = 0
        self._last_ping = None
