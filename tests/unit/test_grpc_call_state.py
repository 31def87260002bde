"""The gRPC call's state table: every legal move, every illegal one, every way to CLOSED."""

from __future__ import annotations

import itertools

import pytest

from tritium.frontends.grpc.call_state import (
    CLIENT_DONE,
    DECIDED,
    CallEvent,
    CallState,
    IllegalMove,
    next_state,
)

S, E = CallState, CallEvent

# Written out here rather than read from the module, so a changed table fails a test.
LEGAL: dict[tuple[CallState, CallEvent], CallState] = {
    (S.OPEN, E.END_STREAM): S.HALF_CLOSED,
    (S.OPEN, E.END): S.ENDING,
    (S.OPEN, E.RESET): S.CLOSED,
    (S.OPEN, E.LOST): S.CLOSED,
    (S.HALF_CLOSED, E.END): S.ENDING_HALF_CLOSED,
    (S.HALF_CLOSED, E.RESET): S.CLOSED,
    (S.HALF_CLOSED, E.LOST): S.CLOSED,
    (S.ENDING, E.END_STREAM): S.ENDING_HALF_CLOSED,
    (S.ENDING, E.FLUSHED): S.CLOSED,
    (S.ENDING, E.RESET): S.CLOSED,
    (S.ENDING, E.LOST): S.CLOSED,
    (S.ENDING_HALF_CLOSED, E.FLUSHED): S.CLOSED,
    (S.ENDING_HALF_CLOSED, E.RESET): S.CLOSED,
    (S.ENDING_HALF_CLOSED, E.LOST): S.CLOSED,
    (S.HALF_CLOSED, E.REPLIED): S.CLOSED,
}
ILLEGAL = [pair for pair in itertools.product(CallState, CallEvent) if pair not in LEGAL]


@pytest.mark.parametrize(("state", "event"), list(LEGAL))
def test_legal_move(state: CallState, event: CallEvent) -> None:
    assert next_state(state, event) is LEGAL[state, event]


@pytest.mark.parametrize(("state", "event"), ILLEGAL)
def test_every_other_move_is_illegal(state: CallState, event: CallEvent) -> None:
    with pytest.raises(IllegalMove) as caught:
        next_state(state, event)
    assert event.name in str(caught.value) and state.name in str(caught.value)


def test_closed_is_final() -> None:
    assert all((S.CLOSED, event) in ILLEGAL for event in CallEvent)


def test_end_stream_twice_is_illegal() -> None:
    with pytest.raises(IllegalMove):
        next_state(next_state(S.OPEN, E.END_STREAM), E.END_STREAM)


def test_ended_call_is_closed_only_when_flushed() -> None:
    for state in (S.OPEN, S.HALF_CLOSED):
        assert next_state(state, E.END) is not S.CLOSED


def _end(events: list[CallEvent]) -> CallState:
    state = S.OPEN
    for event in events:
        state = next_state(state, event)
    return state


# Each way a call can end, as the connection drives it.
ENDINGS = {
    "unary answered": [E.END_STREAM, E.END, E.FLUSHED],
    "answered before the request ended": [E.END, E.FLUSHED],
    "answered, then the client half-closed": [E.END, E.END_STREAM, E.FLUSHED],
    "reset while open": [E.RESET],
    "reset after the request": [E.END_STREAM, E.RESET],
    "reset while the reply waits for window": [E.END_STREAM, E.END, E.RESET],
    "reset while ending open": [E.END, E.RESET],
    "lost while open": [E.LOST],
    "lost after the request": [E.END_STREAM, E.LOST],
    "lost while ending": [E.END, E.LOST],
    "lost while the reply waits for window": [E.END_STREAM, E.END, E.LOST],
}


@pytest.mark.parametrize("events", list(ENDINGS.values()), ids=list(ENDINGS))
def test_every_way_a_call_ends_reaches_closed(events: list[CallEvent]) -> None:
    assert _end(events) is S.CLOSED


def test_every_state_can_reach_closed_by_reset_and_loss() -> None:
    for state in CallState:
        if state is not S.CLOSED:
            assert next_state(state, E.RESET) is S.CLOSED
            assert next_state(state, E.LOST) is S.CLOSED


def test_decided_and_client_done_sets() -> None:
    assert {S.ENDING, S.ENDING_HALF_CLOSED, S.CLOSED} == DECIDED
    assert {S.HALF_CLOSED, S.ENDING_HALF_CLOSED} == CLIENT_DONE
    # END is legal exactly where the outcome is not yet decided.
    assert {state for (state, event) in LEGAL if event is E.END} == set(CallState) - DECIDED
    # END_STREAM is legal exactly where the client has not finished.
    assert {state for (state, event) in LEGAL if event is E.END_STREAM} == \
        set(CallState) - CLIENT_DONE - {S.CLOSED}


def test_the_one_step_reply_is_its_two_moves() -> None:
    """REPLIED, the usual unary reply going out whole, is END then FLUSHED, and legal only
    where both are: once the request is whole."""
    assert next_state(S.HALF_CLOSED, E.REPLIED) is \
        next_state(next_state(S.HALF_CLOSED, E.END), E.FLUSHED)
    assert [state for (state, event) in LEGAL if event is E.REPLIED] == [S.HALF_CLOSED]
