"""Per-model request queue: priority levels, FIFO within a level, lazy removal.

A cancelled request is removed logically at once (it no longer counts, and is never
returned by ``pop``) and physically when the queue next passes over it, so cancelling
costs O(1) whatever the queue length. A request whose timeout expired under the DELAY
action moves to its level's *delayed* lane, served after the level's other requests;
its old place is skipped the same lazy way.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator

from tritium.core.request import AdmittedRequest, RequestStage

_QUEUED = RequestStage.QUEUED


class _Level:
    __slots__ = ("delayed", "ready", "size")

    def __init__(self) -> None:
        self.ready: collections.deque[AdmittedRequest] = collections.deque()
        self.delayed: collections.deque[AdmittedRequest] = collections.deque()
        self.size = 0  # live requests in both lanes


class RequestQueue:
    def __init__(self, priority_levels: int = 0, default_priority: int = 0):
        # Index 0 is the highest priority (Triton's level 1).
        self._levels = [_Level() for _ in range(max(priority_levels, 1))]
        self._default_level = max(default_priority - 1, 0) if priority_levels else 0
        # The one level when there are no priorities (the usual case): every request goes
        # there, so ``push`` needs no ``level_of``.
        self._only = self._levels[0] if len(self._levels) == 1 else None
        # Live requests queued (what ``len`` returns); read-only outside this class, an
        # attribute so that the scheduler's dispatch loop reads it without a call.
        self.size = 0
        # Requests that were moved to a delayed lane; their copy in the ready lane is
        # stale. Invariant: that stale copy leaves the ready lane before the delayed copy
        # is reached, because a level's delayed lane is only read once its ready lane is
        # empty; so a request leaves this set when its delayed copy is passed over.
        self._moved: set[AdmittedRequest] = set()

    def __len__(self) -> int:
        return self.size

    def level_of(self, request: AdmittedRequest) -> int:
        priority = request.request.priority
        if priority <= 0 or priority > len(self._levels):
            return self._default_level
        return priority - 1

    def level_size(self, level: int) -> int:
        """Live requests queued at ``level`` (0 is the highest priority)."""
        return self._levels[level].size

    def push(self, request: AdmittedRequest) -> None:
        request.move_to(_QUEUED)
        level = self._only
        if level is None:
            level = self._levels[self.level_of(request)]
        level.ready.append(request)
        level.size += 1
        self.size += 1

    def discard(self, request: AdmittedRequest) -> bool:
        """Forget a queued request; returns False if it was not queued."""
        if request.stage is not _QUEUED:
            return False
        request.move_to(RequestStage.DONE)
        self._levels[self.level_of(request)].size -= 1
        self.size -= 1
        return True

    def delay(self, request: AdmittedRequest) -> bool:
        """Move a queued request behind every other request of its level."""
        if request.stage is not _QUEUED or request in self._moved:
            return False
        self._moved.add(request)
        self._levels[self.level_of(request)].delayed.append(request)
        return True

    def peek(self) -> AdmittedRequest | None:
        for level in self._levels:
            request = self._front(level)
            if request is not None:
                return request
        return None

    def pop(self) -> AdmittedRequest | None:
        for level in self._levels:
            ready = level.ready
            if ready:
                # The usual case, without a call to ``_front``: the head of the ready lane
                # is live.
                head = ready[0]
                if head.stage is _QUEUED and not (self._moved and head in self._moved):
                    ready.popleft()
                    level.size -= 1
                    self.size -= 1
                    return head
            request = self._front(level)
            if request is not None:
                lane = level.ready if level.ready else level.delayed
                lane.popleft()
                if lane is level.delayed:
                    self._moved.discard(request)
                level.size -= 1
                self.size -= 1
                return request
        return None

    def __iter__(self) -> Iterator[AdmittedRequest]:
        """The live requests in the order ``pop`` would return them."""
        moved = self._moved
        for level in self._levels:
            for request in level.ready:
                if request.stage is _QUEUED and request not in moved:
                    yield request
            for request in level.delayed:
                if request.stage is _QUEUED:
                    yield request

    def drain(self) -> list[AdmittedRequest]:
        """Remove and return every queued request."""
        taken = []
        while (request := self.pop()) is not None:
            taken.append(request)
        return taken

    def _front(self, level: _Level) -> AdmittedRequest | None:
        """The first live request of ``level``, dropping dead entries in front of it."""
        ready = level.ready
        moved = self._moved
        while ready:
            request = ready[0]
            if request.stage is _QUEUED and not (moved and request in moved):
                return request
            ready.popleft()
        delayed = level.delayed
        while delayed:
            request = delayed[0]
            if request.stage is _QUEUED:
                return request
            delayed.popleft()
            moved.discard(request)
        return None
