"""preserve_ordering: responses leave in the order their requests were dispatched."""

from __future__ import annotations

from tritium.core.request import AdmittedRequest
from tritium.core.response import ResponseStream, wake_all


class OrderedDelivery:
    """Holds back a finished batch's responses until every batch dispatched before it has
    delivered its own (instances finish in any order; clients see dispatch order).

    Covers the responses ``execute`` returns; a model that sends through its response
    sender while it runs delivers those at once.
    """

    def __init__(self) -> None:
        self._next = 0  # sequence number of the next batch dispatched
        self._due = 0  # sequence number of the next batch allowed to deliver
        self._sequence: dict[int, int] = {}  # id(batch) -> its sequence number
        self._held: dict[int, list[ResponseStream]] = {}

    def dispatched(self, batch: list[AdmittedRequest]) -> None:
        self._sequence[id(batch)] = self._next
        self._next += 1

    def finished(self, batch: list[AdmittedRequest], woken: list[ResponseStream]) -> None:
        self._held[self._sequence.pop(id(batch))] = woken
        while self._due in self._held:
            wake_all(self._held.pop(self._due))
            self._due += 1
