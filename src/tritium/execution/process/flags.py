"""Per-request cancel flags in shared memory: the child's ``is_cancelled()`` is one read.

The server owns the table: it gives each request it sends to an instance process a slot,
clears it, and writes the cancel reason's code into it the moment the request's
``Cancellation`` fires (a callback on the loop). The child only reads its byte.
A cancellation is one request's, so it follows one slot: the slot its request was last
given (a request run again, rescheduled, takes a new one). Its callback stays registered
once the slot is given back (removing it would cost every request more than this look-up
costs a cancelled one), and then finds no slot to set: a late callback cannot flip the
slot's next user. (A bound method and a look-up cost less than a closure or a partial
with a generation per slot, measured.)
"""

from __future__ import annotations

import mmap
import os

from tritium.core.cancellation import Cancellation, CancelReason
from tritium.execution.process.shm import layout

SLOTS = 1 << 16
_REASONS = list(CancelReason)
_CODES = {reason: index + 1 for index, reason in enumerate(_REASONS)}


def reason_of(code: int) -> CancelReason | None:
    return _REASONS[code - 1] if 0 < code <= len(_REASONS) else None


class FlagTable:
    """The server's side: slots handed out, cleared, and set on cancel."""

    def __init__(self, slots: int = SLOTS) -> None:
        self.slots = slots
        self.fd = os.memfd_create(f"{layout().name_prefix}flags", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, slots)
        self._mm = mmap.mmap(self.fd, slots)
        self._free = list(range(slots - 1, -1, -1))
        self._held: dict[Cancellation, int] = {}  # the slot each cancellation holds

    def acquire(self, cancellation: Cancellation) -> int:
        """A cleared slot that follows ``cancellation`` from now on; -1 when none is free."""
        free = self._free
        if not free:
            return -1
        slot = free.pop()
        self._mm[slot] = 0
        self._held[cancellation] = slot
        cancellation.add_callback(self._set)
        return slot

    def release(self, slot: int, cancellation: Cancellation) -> None:
        """``cancellation`` gives its ``slot`` back (it no longer sets it)."""
        held = self._held
        if held.get(cancellation) == slot:  # not a slot it was given again since
            del held[cancellation]
        self._free.append(slot)

    def _set(self, cancellation: Cancellation) -> None:
        slot = self._held.get(cancellation)
        if slot is not None and cancellation.reason is not None and not self._mm.closed:
            self._mm[slot] = _CODES[cancellation.reason]

    def close(self) -> None:
        """The memfd and the mapping's own descriptor (mmap keeps a duplicate), now; and
        the requests still held (their callbacks name this table: no cycle is left)."""
        os.close(self.fd)
        self._mm.close()
        self._held.clear()


class FlagView:
    """The child's side: reads only."""

    def __init__(self, fd: int, slots: int) -> None:
        self._view = memoryview(mmap.mmap(fd, slots, mmap.MAP_SHARED, mmap.PROT_READ))
        # A slot's flag reads the same for every request given that slot: one object each,
        # made once (the server hands out the slots it freed last, so few are ever made).
        self._cancellations: dict[int, SlotCancellation] = {}

    def cancellation(self, slot: int) -> SlotCancellation:
        cancellation = self._cancellations.get(slot)
        if cancellation is None:
            cancellation = self._cancellations[slot] = SlotCancellation(self._view, slot)
        return cancellation


class SlotCancellation:
    """What a child-side request offers as ``cancellation`` (is_cancelled and reason)."""

    __slots__ = ("_slot", "_view")

    def __init__(self, view: memoryview, slot: int) -> None:
        self._view = view
        self._slot = slot

    def is_cancelled(self) -> bool:
        return self._view[self._slot] != 0  # models call it every token: one byte read

    @property
    def reason(self) -> CancelReason | None:
        return reason_of(self._view[self._slot])
