"""Per-model request queue: priority levels, FIFO within a level, lazy removal.

A cancelled request is removed logically at once (it no longer counts, and is never
returned by ``pop``) and physically when the queue next passes over it, so cancelling
costs O(1) whatever the queue length.
"""

from __future__ import annotations

import collections

from tritium.core.request import InferenceRequest, RequestStage


class RequestQueue:
    def __init__(self, priority_levels: int = 0, default_priority: int = 0):
        # Level 0 of the list is the highest priority (Triton's level 1).
        self._levels: list[collections.deque[InferenceRequest]] = [
            collections.deque() for _ in range(max(priority_levels, 1))
        ]
        self._default_level = max(default_priority - 1, 0) if priority_levels else 0
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def level_of(self, request: InferenceRequest) -> int:
        if request.priority <= 0 or request.priority > len(self._levels):
            return self._default_level
        return request.priority - 1

    def push(self, request: InferenceRequest) -> None:
        request.stage = RequestStage.QUEUED
        self._levels[self.level_of(request)].append(request)
        self._size += 1

    def discard(self, request: InferenceRequest) -> bool:
        """Forget a queued request; returns False if it was not queued."""
        if request.stage is not RequestStage.QUEUED:
            return False
        request.stage = RequestStage.DONE
        self._size -= 1
        return True

    def peek(self) -> InferenceRequest | None:
        for level in self._levels:
            while level:
                request = level[0]
                if request.stage is RequestStage.QUEUED:
                    return request
                level.popleft()
        return None

    def pop(self) -> InferenceRequest | None:
        request = self.peek()
        if request is not None:
            self._levels[self.level_of(request)].popleft()
            self._size -= 1
        return request

    def drain(self) -> list[InferenceRequest]:
        """Remove and return every queued request."""
        taken = []
        while (request := self.pop()) is not None:
            taken.append(request)
        return taken
