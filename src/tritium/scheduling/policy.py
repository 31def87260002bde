"""What config.pbtxt says about scheduling a model: batching, priorities, queue policies,
sequences."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tritium.core.errors import invalid
from tritium.core.types import DataType
from tritium.scheduling.implicit_state import ImplicitState, implicit_states


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

SEQUENCE_IDLE_DEFAULT_US = 1_000_000


class ControlKind(enum.Enum):
    """What a sequence control tensor tells the model (Triton's ``Control.Kind`` numbers)."""

    START = 0
    READY = 1
    END = 2
    CORRID = 3


@dataclass(frozen=True, slots=True)
class SequenceControl:
    """One ``control_input``: a tensor the sequence batcher adds to every request."""

    name: str
    kind: ControlKind
    datatype: DataType
    false_value: float = 0  # START / READY / END: the value when the flag is off
    true_value: float = 1


# The value fields a START / READY / END control may use, with the tensor type each gives.
_FLAG_FIELDS = (
    ("int32_false_true", DataType.INT32),
    ("fp32_false_true", DataType.FP32),
    ("bool_false_true", DataType.BOOL),
)
_CORRID_TYPES = (DataType.UINT64, DataType.INT64, DataType.UINT32, DataType.INT32,
                 DataType.BYTES)


@dataclass(frozen=True, slots=True)
class OldestPolicy:
    """``sequence_batching.oldest``: requests of several sequences batched together."""

    max_candidate_sequences: int = 0  # 0: max(1, max_batch_size), as in Triton
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    preserve_ordering: bool = False


@dataclass(frozen=True, slots=True)
class DirectPolicy:
    """``sequence_batching.direct``: when a batch of a model's slots may wait for more."""

    max_queue_delay_us: int = 0
    minimum_slot_utilization: float = 0.0  # with no delay, or 0: a batch never waits


@dataclass(frozen=True, slots=True)
class SequencePolicy:
    """A model's ``sequence_batching`` settings."""

    max_idle_us: int = SEQUENCE_IDLE_DEFAULT_US
    controls: tuple[SequenceControl, ...] = ()
    # ``iterative_sequence: true``: a request without a correlation id starts a sequence of
    # its own, and the model may reschedule the requests it executes.
    iterative: bool = False
    oldest: OldestPolicy | None = None  # None: the direct strategy
    direct: DirectPolicy = DirectPolicy()
    states: tuple[ImplicitState, ...] = ()

    @classmethod
    def from_config(cls, message: Any, model: str, max_batch_size: int = 0,
                    model_dir: Path | None = None) -> SequencePolicy:
        """From a ``ModelSequenceBatching`` protobuf message of model ``model``."""
        controls: list[SequenceControl] = []
        for control_input in message.control_input:
            name = control_input.name
            if len(control_input.control) != 1:
                raise invalid(f"sequence batching control input '{name}' of model '{model}' "
                              "must specify exactly one control")
            if any(control.name == name for control in controls):
                raise invalid(f"sequence batching control input '{name}' of model '{model}' "
                              "is specified more than once")
            controls.append(_control(name, control_input.control[0], model))
        oldest = None
        if message.WhichOneof("strategy_choice") == "oldest":
            settings = message.oldest
            oldest = OldestPolicy(settings.max_candidate_sequences,
                                  tuple(settings.preferred_batch_size),
                                  settings.max_queue_delay_microseconds,
                                  settings.preserve_ordering)
        direct = DirectPolicy(message.direct.max_queue_delay_microseconds,
                              message.direct.minimum_slot_utilization)
        return cls(
            max_idle_us=message.max_sequence_idle_microseconds or SEQUENCE_IDLE_DEFAULT_US,
            controls=tuple(controls),
            iterative=message.iterative_sequence,
            oldest=oldest,
            direct=direct,
            states=implicit_states(message, max_batch_size, model_dir),
        )


def _control(name: str, message: Any, model: str) -> SequenceControl:
    kind = ControlKind(message.kind)
    where = f"sequence batching control input '{name}' of model '{model}'"
    if kind is ControlKind.CORRID:
        datatype = DataType.from_code(message.data_type)
        if datatype not in _CORRID_TYPES:
            raise invalid(f"{where}: CONTROL_SEQUENCE_CORRID must have data_type TYPE_UINT64, "
                          "TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING")
        return SequenceControl(name, kind, datatype)
    given = [(list(getattr(message, field)), datatype) for field, datatype in _FLAG_FIELDS
             if len(getattr(message, field))]
    if len(given) != 1 or len(given[0][0]) != 2:
        raise invalid(f"{where}: CONTROL_SEQUENCE_{kind.name} must specify exactly one of "
                      "int32_false_true, fp32_false_true or bool_false_true, with two values "
                      "(false, true)")
    (false_value, true_value), datatype = given[0]
    return SequenceControl(name, kind, datatype, false_value, true_value)


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
    # Set for a stateful model (``sequence_batching``): the sequence scheduler serves it.
    sequence: SequencePolicy | None = None
    # As Triton's batchers: the inputs whose shape every request of a batch shares (a
    # variable dimension, no ``allow_ragged_batch``), and whether the model has optional
    # inputs (then the requests of a batch carry the same inputs).
    equal_shape_inputs: tuple[str, ...] = ()
    optional_inputs: bool = False

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
    def from_config(cls, config: Any, model_dir: Path | None = None) -> SchedulerPolicy:
        """From a completed ``ModelConfig`` protobuf message (``model_dir``: where a
        sequence's initial state files are)."""
        shapes = _batch_shapes(config)
        if config.HasField("sequence_batching"):
            sequence = SequencePolicy.from_config(config.sequence_batching, config.name,
                                                  config.max_batch_size, model_dir)
            return cls(max_batch_size=config.max_batch_size, sequence=sequence, **shapes)
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
            **shapes,
        )


def _batch_shapes(config: Any) -> dict[str, Any]:
    """``SchedulerPolicy``'s shape rule fields, from the config's inputs (Triton's
    ``enforce_equal_shape_tensors``: python models have no shape tensors)."""
    equal = tuple(tensor.name for tensor in config.input
                  if -1 in tensor.dims and not tensor.allow_ragged_batch)
    return {"equal_shape_inputs": equal,
            "optional_inputs": any(tensor.optional for tensor in config.input)}
