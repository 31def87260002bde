"""Flow-control windows both ways and the server's budget of request bytes."""

from __future__ import annotations

import pytest

from tritium.frontends.grpc.http2 import MAX_WINDOW
from tritium.frontends.grpc.windows import (
    ByteBudget,
    PeerBudgets,
    RecvWindow,
    SendWindow,
    WindowError,
)


def test_recv_window_takes_exactly_what_was_granted() -> None:
    window = RecvWindow(100)
    window.receive(60)
    window.receive(40)
    assert window.available == 0
    window.receive(0)


def test_recv_window_overrun_raises() -> None:
    window = RecvWindow(100)
    window.receive(60)
    with pytest.raises(WindowError):
        window.receive(41)
    assert window.available == 40  # an overrun takes nothing


def test_consume_returns_credit_in_batches_of_at_least_half_the_window() -> None:
    window = RecvWindow(100)
    increments = []
    for _ in range(20):
        window.receive(7)
        increments.append(window.consume(7))
    returned = [step for step in increments if step]
    assert returned and all(step >= 50 for step in returned)
    assert len(returned) < len(increments) // 2
    assert sum(returned) + window.unreturned == 140
    assert window.available == 100 - window.unreturned


def test_consume_of_half_the_window_returns_it_at_once() -> None:
    window = RecvWindow(100)
    window.receive(50)
    assert window.consume(50) == 50
    assert window.available == 100


def test_credit_not_returned_keeps_the_window_shut() -> None:
    window = RecvWindow(100)
    window.receive(100)
    assert window.consume(10) == 0
    with pytest.raises(WindowError):
        window.receive(1)


def test_send_window_grows_to_the_limit_and_no_further() -> None:
    window = SendWindow(65535)
    window.grow(MAX_WINDOW - 65535)
    assert window.size == MAX_WINDOW
    with pytest.raises(WindowError):
        window.grow(1)
    assert window.size == MAX_WINDOW


def test_send_window_may_go_negative_and_grow_back() -> None:
    window = SendWindow(100)
    window.spend(80)
    window.grow(-50)  # the peer shrank SETTINGS_INITIAL_WINDOW_SIZE
    assert window.size == -30
    window.grow(40)
    assert window.size == 10


def test_budget_reserves_up_to_its_limit() -> None:
    budget = ByteBudget(100)
    assert budget.reserve(60)
    assert not budget.reserve(41)
    assert budget.held == 60
    assert budget.reserve(40)
    budget.release(100)
    assert budget.held == 0


def test_release_retries_waiters_oldest_first() -> None:
    budget = ByteBudget(100)
    assert budget.reserve(100)
    order: list[str] = []

    def waiter(name: str, size: int) -> None:
        def retry() -> None:
            order.append(name)
            if not budget.reserve(size):
                budget.wait(name, retry)
        budget.wait(name, retry)

    waiter("first", 30)
    waiter("second", 50)
    waiter("third", 40)
    budget.release(100)
    assert order == ["first", "second", "third"]
    assert budget.held == 80  # first and second fit; third waits again
    order.clear()
    budget.release(30)
    assert order == ["third"]
    assert budget.held == 90


def test_release_stops_retrying_once_the_budget_is_spent() -> None:
    budget = ByteBudget(100)
    assert budget.reserve(100)
    order: list[str] = []

    def retry_taking(name: str, size: int) -> None:
        order.append(name)
        assert budget.reserve(size)

    budget.wait("greedy", lambda: retry_taking("greedy", 100))
    budget.wait("later", lambda: retry_taking("later", 1))
    budget.release(100)
    assert order == ["greedy"]
    budget.release(100)
    assert order == ["greedy", "later"]


def test_forgotten_waiter_is_not_retried() -> None:
    budget = ByteBudget(10)
    assert budget.reserve(10)
    called: list[str] = []
    budget.wait("gone", lambda: called.append("gone"))
    budget.forget("gone")
    budget.forget("never waited")
    budget.release(10)
    assert called == []


def test_a_peers_share_holds_in_the_server_budget_too() -> None:
    server = ByteBudget(100)
    one, other = ByteBudget(60, server), ByteBudget(60, server)
    assert one.ceiling == 60 and ByteBudget(500, server).ceiling == 100
    assert one.reserve(60)
    assert not one.reserve(1)  # its share is spent, though the server has room
    assert server.held == 60 and server.room() == 40
    assert other.room() == 40  # the server's room is the smaller
    assert not other.reserve(41)
    assert other.reserve(40)
    one.release(60)
    assert (one.held, other.held, server.held) == (0, 40, 40)


def test_a_waiter_is_retried_when_what_it_lacked_comes_back() -> None:
    """Waiting on a spent share, release within that share retries it; waiting with room
    in its share but none in the server, any peer's release retries it."""
    server = ByteBudget(100)
    one, other = ByteBudget(60, server), ByteBudget(60, server)
    assert one.reserve(60) and other.reserve(40)
    called: list[str] = []
    one.wait("one", lambda: called.append("one"))  # its share is spent
    other.wait("other", lambda: called.append("other"))  # the server is spent
    other.release(10)
    assert called == ["other"]
    one.release(10)
    assert called == ["other", "one"]
    other.wait("gone", lambda: called.append("gone"))
    other.forget("gone")
    one.release(50)
    assert called == ["other", "one"]


def test_peer_budgets_share_one_per_address_while_it_has_connections() -> None:
    peers = PeerBudgets(ByteBudget(100), 30)
    first = peers.join("10.0.0.1")
    assert peers.join("10.0.0.1") is first and len(peers) == 1
    assert peers.join("10.0.0.2") is not first and len(peers) == 2
    peers.leave("10.0.0.1")
    assert peers.join("10.0.0.1") is first
    peers.leave("10.0.0.1")
    peers.leave("10.0.0.1")
    assert len(peers) == 1
