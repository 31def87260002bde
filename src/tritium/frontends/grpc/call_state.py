"""Where a gRPC call (one HTTP/2 stream) is in its life, and the only moves it can make.

The client's half and ours close separately (RFC 9113 §5.1): the client half-closes when its
request is whole; ours closes with the trailers, which may wait behind data the peer has no
window for yet. A move the table does not list is the peer breaking the protocol.
"""

from __future__ import annotations

import enum


# Integer enums: a state is looked up a few times per call, and an int hashes in C.
class CallState(enum.IntEnum):
    OPEN = 0  # the request may still arrive; the reply is not decided
    HALF_CLOSED = 1  # the client sent END_STREAM: the whole request is in
    ENDING = 2  # the outcome is decided; data and trailers wait for window
    ENDING_HALF_CLOSED = 3
    CLOSED = 4  # nothing more is sent or received for it


# The states the per-request paths compare with, as module globals for those paths to import
# (core/types.py says why an enum member is not read there).
OPEN, HALF_CLOSED, CLOSED = CallState.OPEN, CallState.HALF_CLOSED, CallState.CLOSED


class CallEvent(enum.IntEnum):
    END_STREAM = 0  # the client half-closed
    END = 1  # this side decided the outcome
    FLUSHED = 2  # everything queued for the call is written
    RESET = 3  # the stream was reset
    LOST = 4  # the connection is gone
    # The usual unary reply, in one step: the whole reply and its end went out at once,
    # nothing waiting for window (END, then FLUSHED).
    REPLIED = 5


MOVES: dict[tuple[CallState, CallEvent], CallState] = {
    (CallState.OPEN, CallEvent.END_STREAM): CallState.HALF_CLOSED,
    (CallState.OPEN, CallEvent.END): CallState.ENDING,
    (CallState.HALF_CLOSED, CallEvent.END): CallState.ENDING_HALF_CLOSED,
    (CallState.ENDING, CallEvent.END_STREAM): CallState.ENDING_HALF_CLOSED,
    (CallState.ENDING, CallEvent.FLUSHED): CallState.CLOSED,
    (CallState.ENDING_HALF_CLOSED, CallEvent.FLUSHED): CallState.CLOSED,
}
for _state in (CallState.OPEN, CallState.HALF_CLOSED, CallState.ENDING,
               CallState.ENDING_HALF_CLOSED):
    MOVES[_state, CallEvent.RESET] = CallState.CLOSED
    MOVES[_state, CallEvent.LOST] = CallState.CLOSED

# REPLIED is END then FLUSHED, read off the table: the two moves it stands for.
MOVES[CallState.HALF_CLOSED, CallEvent.REPLIED] = MOVES[
    MOVES[CallState.HALF_CLOSED, CallEvent.END], CallEvent.FLUSHED]

# The table by event: where each event leads from each state it may happen in. The hot paths
# look a move up here, with no (state, event) key to build; a state missing is illegal.
BY_EVENT: dict[CallEvent, dict[CallState, CallState]] = {event: {} for event in CallEvent}
for (_state, _event), _next in MOVES.items():
    BY_EVENT[_event][_state] = _next

# States in which the reply is decided: a handler's late answer is dropped.
DECIDED = frozenset({CallState.ENDING, CallState.ENDING_HALF_CLOSED, CallState.CLOSED})
# States in which the client has finished sending.
CLIENT_DONE = frozenset({CallState.HALF_CLOSED, CallState.ENDING_HALF_CLOSED})


class IllegalMove(Exception):
    """An event that cannot happen in the call's state (from the peer: a stream error)."""


def next_state(state: CallState, event: CallEvent) -> CallState:
    found = MOVES.get((state, event))
    if found is None:
        raise IllegalMove(f"{event.name} while the call is {state.name}")
    return found
