"""The rate limiter's resources: how many copies of each exist, on each device and shared by
every device, and how many are taken. Pure: owners are any hashable key, nothing waits here.

As Triton's rate limiter counts them: an owner (a model instance) names resources and counts
in its instance group's ``rate_limiter``; a resource marked ``global`` is one pool for the
whole server, any other is a pool per device, checked against the device the instance runs
on. A pool holds the most any registered owner needs, unless ``--rate-limit-resource`` gives
counts: then each pool holds what was given (the larger of a device's own count and the
every-device count; for a global resource, the largest count given on any device) and a
resource given no count has none, so an owner needing more than its pool fails to register.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass

from tritium.core.errors import ErrorCode, TritiumError

GLOBAL = -2  # the pool key of the resources every device shares
EVERY_DEVICE = -1  # the device of a --rate-limit-resource count that names none

# pool key (a device, or GLOBAL) -> resource name -> count
Counts = dict[int, dict[str, int]]


@dataclass(frozen=True, slots=True)
class ResourceNeed:
    """One entry of an instance group's ``rate_limiter.resources``."""

    name: str
    count: int
    shared: bool = False  # ``global: true``


class ResourcePool:
    """Registered owners' needs, the pools they define, and what is taken from them."""

    def __init__(self, given: Iterable[tuple[str, int, int]] = ()):
        # --rate-limit-resource (name, count, device): a name given twice on one device keeps
        # the smaller count, as tritonserver does.
        self._given: Counts = {}
        for name, count, device in given:
            on_device = self._given.setdefault(device, {})
            on_device[name] = min(count, on_device.get(name, count))
        self._needs: dict[Hashable, Counts] = {}
        self._limits: Counts = {}
        self._taken: Counts = {}
        self._holding: set[Hashable] = set()  # owners whose ``try_take`` took

    def add(self, owner: Hashable, device: int, needs: Iterable[ResourceNeed]) -> None:
        """Register ``owner`` (running on ``device``) and what each run of it takes.
        Raises TritiumError (nothing registered) when the pools cannot serve it."""
        counts: Counts = {}
        for need in needs:
            counts.setdefault(GLOBAL if need.shared else device, {})[need.name] = need.count
        self._needs[owner] = counts
        try:
            self._limits = self._compute_limits()
        except TritiumError:
            del self._needs[owner]
            raise

    def remove(self, owner: Hashable) -> None:
        """Forget ``owner`` (returning what it holds); the pools shrink to what the others
        need (or were given)."""
        self.give_back(owner)
        if self._needs.pop(owner, None) is not None:
            self._limits = self._compute_limits()

    def limits(self) -> Counts:
        """Each pool's size, by pool key (a device, or GLOBAL) and resource name."""
        return {key: dict(pool) for key, pool in self._limits.items()}

    def try_take(self, owner: Hashable) -> bool:
        """Take everything ``owner`` needs if all of it is free now; else take nothing."""
        needs = self._needs.get(owner)
        if needs is None or owner in self._holding:
            return False
        taken, limits = self._taken, self._limits
        for key, pool in needs.items():
            in_use = taken.get(key, {})
            for name, count in pool.items():
                if in_use.get(name, 0) + count > limits[key][name]:
                    return False
        for key, pool in needs.items():
            in_use = taken.setdefault(key, {})
            for name, count in pool.items():
                in_use[name] = in_use.get(name, 0) + count
        self._holding.add(owner)
        return True

    def give_back(self, owner: Hashable) -> None:
        """Return what ``owner``'s ``try_take`` took (nothing when it holds nothing)."""
        if owner not in self._holding:
            return
        self._holding.discard(owner)
        for key, pool in self._needs.get(owner, {}).items():
            in_use = self._taken[key]
            for name, count in pool.items():
                in_use[name] -= count

    # -- pool sizes ------------------------------------------------------------------
    def _compute_limits(self) -> Counts:
        limits: Counts = {}
        for counts in self._needs.values():
            for key, pool in counts.items():
                largest = limits.setdefault(key, {})
                for name, count in pool.items():
                    largest[name] = max(count, largest.get(name, 0))
        _check_not_both(limits)
        if self._given:
            for key, pool in limits.items():
                for name, needed in pool.items():
                    available = self._given_count(key, name)
                    if available < needed:
                        raise TritiumError(
                            ErrorCode.INVALID_ARG,
                            f'Resource count for "{name}" is limited to {available} which will '
                            "prevent scheduling of one or more model instances, the minimum "
                            f"required count is {needed}")
                    pool[name] = available
        return limits

    def _given_count(self, key: int, name: str) -> int:
        """What --rate-limit-resource gives pool ``key`` of ``name`` (0: nothing given)."""
        if key == GLOBAL:
            return max((pool.get(name, 0) for pool in self._given.values()), default=0)
        return max(self._given.get(key, {}).get(name, 0),
                   self._given.get(EVERY_DEVICE, {}).get(name, 0))


def _check_not_both(limits: Counts) -> None:
    for name in limits.get(GLOBAL, {}):
        if any(name in pool for key, pool in limits.items() if key != GLOBAL):
            raise TritiumError(
                ErrorCode.INVALID_ARG,
                f'Resource "{name}" is present as both global and device-specific resource in '
                "the model configuration.")
