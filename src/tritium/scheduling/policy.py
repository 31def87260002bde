"""What config.pbtxt says about scheduling a model: batching, priorities, queue policies."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class TimeoutAction(enum.Enum):
    """What happens to a request still queued when its timeout expires (Triton's names)."""

    REJECT = 0  # answered UNAVAILABLE "Request timeout expired"
    DELAY = 1  # moved behind the unexpired requests of its priority level


class TimeoutOverride(enum.Enum):
    """Whether a request's own ``timeout`` parameter may lower the queue's default."""

    DENY = 0
    ALLOW = 1


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """One priority level's ``ModelQueuePolicy``."""

    timeout_action: TimeoutAction = TimeoutAction.REJECT
    default_timeout_us: int = 0  # 0: requests never expire
    timeout_override: TimeoutOverride = TimeoutOverride.DENY
    max_queue_size: int = 0  # 0: unbounded

    def timeout_us(self, requested_us: int) -> int:
        """The queue timeout of a request that asked for ``requested_us`` (0: none).

        As in Triton, a request only ever shortens a non-zero default, and only when the
        policy allows it.
        """
        default = self.default_timeout_us
        if (self.timeout_override is TimeoutOverride.ALLOW
                and 0 < requested_us < default):
            return requested_us
        return default

    @classmethod
    def from_config(cls, message: Any) -> QueuePolicy:
        """From a ``ModelQueuePolicy`` protobuf message."""
        return cls(
            timeout_action=TimeoutAction(message.timeout_action),
            default_timeout_us=message.default_timeout_microseconds,
            timeout_override=(TimeoutOverride.ALLOW if message.allow_timeout_override
                              else TimeoutOverride.DENY),
            max_queue_size=message.max_queue_size,
        )


NO_POLICY = QueuePolicy()


@dataclass(frozen=True, slots=True)
class SchedulerPolicy:
    """A model's scheduling settings; the defaults are Triton's default scheduler."""

    max_batch_size: int = 0
    # Without it each execute() gets one request, FIFO, and no queue policy applies.
    dynamic_batching: bool = False
    max_queue_delay_us: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()
    preserve_ordering: bool = False
    priority_levels: int = 0  # 0: one level
    default_priority: int = 0  # Triton's default_priority_level (1 is highest)
    default_queue_policy: QueuePolicy = NO_POLICY
    # (level, policy) for the levels whose policy is not the default one
    priority_queue_policies: tuple[tuple[int, QueuePolicy], ...] = ()

    def level_policies(self) -> list[QueuePolicy]:
        """The queue policy of each level, highest priority (Triton's level 1) first."""
        levels = max(self.priority_levels, 1)
        policies = [self.default_queue_policy] * levels
        for level, policy in self.priority_queue_policies:
            if 1 <= level <= levels:
                policies[level - 1] = policy
        return policies

    def batch_limit(self) -> int:
        """The largest batch the batcher forms: the largest preferred size, or the maximum."""
        if not self.dynamic_batching:
            return 1
        if self.preferred_batch_sizes:
            return min(max(self.preferred_batch_sizes), max(self.max_batch_size, 1))
        return max(self.max_batch_size, 1)

    def has_timeouts(self) -> bool:
        return any(policy.default_timeout_us for policy in self.level_policies())

    @classmethod
    def from_config(cls, config: Any) -> SchedulerPolicy:
        """From a completed ``ModelConfig`` protobuf message."""
        if not config.HasField("dynamic_batching"):
            return cls(max_batch_size=config.max_batch_size)
        batching = config.dynamic_batching
        per_level = tuple(sorted(
            (level, QueuePolicy.from_config(policy))
            for level, policy in batching.priority_queue_policy.items()
        ))
        return cls(
            max_batch_size=config.max_batch_size,
            dynamic_batching=True,
            max_queue_delay_us=batching.max_queue_delay_microseconds,
            preferred_batch_sizes=tuple(batching.preferred_batch_size),
            preserve_ordering=batching.preserve_ordering,
            priority_levels=batching.priority_levels,
            default_priority=batching.default_priority_level,
            default_queue_policy=QueuePolicy.from_config(batching.default_queue_policy),
            priority_queue_policies=per_level,
        )
