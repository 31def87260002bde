"""When a dead instance process starts again (exponential backoff), and how its death reads."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

# What every request of a batch is answered when its instance process dies, as Triton
# answers it (python_backend stub_launcher.cc ReceiveMessageFromStub; an INTERNAL error).
STUB_UNHEALTHY = "Stub process '{instance}' is not healthy."


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """Delays between restarts: ``first_delay_s``, times ``factor`` after each death that
    follows the last start within ``stable_after_s``, at most ``max_delay_s``.

    An instance that stayed up ``stable_after_s`` before dying starts from the first delay
    again: one crash a day is restarted at once, a crash loop backs off to a restart every
    ``max_delay_s`` (kubelet's CrashLoopBackOff has the same shape).
    """

    first_delay_s: float = 0.1
    factor: float = 2.0
    max_delay_s: float = 30.0
    stable_after_s: float = 60.0
    # Restarts whose ``initialize`` failed, in a row, before the slot gives up: the model
    # cannot come back by itself, and its queue must not wait for it forever.
    max_failed_starts: int = 5


class Backoff:
    """The restart schedule of one instance slot."""

    def __init__(self, policy: RestartPolicy | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.policy = policy or RestartPolicy()
        self._clock = clock
        self._deaths_in_a_row = 0
        self._up_since: float | None = None

    def started(self) -> None:
        """The instance came up (its ``initialize`` returned)."""
        self._up_since = self._clock()

    def died(self) -> float:
        """The instance died, or failed to start: the seconds to wait before the next start."""
        policy = self.policy
        up_since, self._up_since = self._up_since, None
        if up_since is not None and self._clock() - up_since >= policy.stable_after_s:
            self._deaths_in_a_row = 0
        self._deaths_in_a_row += 1
        delay = policy.first_delay_s * policy.factor ** (self._deaths_in_a_row - 1)
        return min(delay, policy.max_delay_s)

    @property
    def deaths_in_a_row(self) -> int:
        return self._deaths_in_a_row


def describe_exit(returncode: int | None) -> str:
    """An exit status as a log line names it: ``killed by signal SIGSEGV (11)``,
    ``exited with code 3``. ``returncode`` follows ``subprocess``: negative for a signal."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        number = -returncode
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = "unknown signal"
        return f"killed by signal {name} ({number})"
    return f"exited with code {returncode}"
