"""Ensemble data flow as pure pieces: which steps are ready, in which order, and when; and
how many of a step may run at once."""

from __future__ import annotations

from collections.abc import Callable

from tritium.ensemble.graph import EnsembleGraph, StepRun, TensorBoard, reshape_dims
from tritium.ensemble.limits import StepLimits
from tritium.ensemble.plan import EnsemblePlan, EnsembleStep


def step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> EnsembleStep:
    return EnsembleStep(model, -1, inputs, outputs)


# IN -> a -> T1 -> b -> OUT
CHAIN = EnsemblePlan("chain", (
    step("a", {"X": "IN"}, {"Y": "T1"}),
    step("b", {"X": "T1"}, {"Y": "OUT"}),
), inputs=("IN",), outputs=("OUT",))

# IN -> split -> (L, R); left(L) -> LO, right(R) -> RO; join(LO, RO) -> OUT; also SIDE = LO
DIAMOND = EnsemblePlan("diamond", (
    step("split", {"X": "IN"}, {"A": "L", "B": "R"}),
    step("left", {"X": "L"}, {"Y": "LO"}),
    step("right", {"X": "R"}, {"Y": "RO"}),
    step("join", {"P": "LO", "Q": "RO"}, {"Y": "OUT"}),
), inputs=("IN",), outputs=("OUT",))

# Two outputs from two branches that share nothing but the input.
FORK = EnsemblePlan("fork", (
    step("a", {"X": "IN"}, {"Y": "OA"}),
    step("b", {"X": "IN"}, {"Y": "OB"}),
), inputs=("IN",), outputs=("OA", "OB"))


def test_a_chain_runs_one_step_after_the_other() -> None:
    board: TensorBoard[str] = TensorBoard(EnsembleGraph(CHAIN), ["OUT"])
    assert board.ready_steps([board.put("IN", "in")]) == [StepRun(0, 0)]
    assert board.take_inputs(StepRun(0, 0)) == {"X": "in"}
    assert board.ready_steps([board.put("T1", "t1")]) == [StepRun(1, 0)]
    assert board.take_inputs(StepRun(1, 0)) == {"X": "t1"}
    updated = [board.put("OUT", "out")]
    assert board.ready_steps(updated) == []
    assert board.ready_outputs(updated) == [0]
    assert board.take_outputs(0) == {"OUT": "out"}
    assert board.held() == 0  # every value was dropped once taken


def test_a_diamond_runs_its_branches_together_and_joins_once_both_are_done() -> None:
    board: TensorBoard[str] = TensorBoard(EnsembleGraph(DIAMOND), ["OUT"])
    assert board.ready_steps([board.put("IN", "in")]) == [StepRun(0, 0)]
    board.take_inputs(StepRun(0, 0))
    # One response of "split" writes both of its outputs: both branches are ready at once.
    updated = [board.put("L", "l"), board.put("R", "r")]
    assert board.ready_steps(updated) == [StepRun(1, 0), StepRun(2, 0)]
    board.take_inputs(StepRun(1, 0))
    board.take_inputs(StepRun(2, 0))
    assert board.ready_steps([board.put("RO", "ro")]) == []  # the join waits for LO
    assert board.ready_steps([board.put("LO", "lo")]) == [StepRun(3, 0)]
    assert board.take_inputs(StepRun(3, 0)) == {"P": "lo", "Q": "ro"}


def test_a_response_needs_every_requested_output_of_the_same_iteration() -> None:
    board: TensorBoard[str] = TensorBoard(EnsembleGraph(FORK), ["OA", "OB"])
    assert board.ready_steps([board.put("IN", "in")]) == [StepRun(0, 0), StepRun(1, 0)]
    assert board.ready_outputs([board.put("OA", "a")]) == []
    assert board.ready_outputs([board.put("OB", "b")]) == [0]
    assert board.take_outputs(0) == {"OA": "a", "OB": "b"}


def test_steps_that_feed_no_requested_output_are_pruned() -> None:
    """Triton's ensemble scheduler skips the steps whose outputs nobody asked for."""
    graph = EnsembleGraph(FORK)
    board: TensorBoard[str] = TensorBoard(graph, ["OB"])
    assert board.needed == frozenset({1})
    assert board.ready_steps([board.put("IN", "in")]) == [StepRun(1, 0)]
    assert graph.needed_steps(["OUT"]) == frozenset()
    assert EnsembleGraph(DIAMOND).needed_steps(["OUT"]) == frozenset({0, 1, 2, 3})


def test_each_response_of_a_decoupled_step_flows_on_as_its_own_iteration() -> None:
    board: TensorBoard[str] = TensorBoard(EnsembleGraph(CHAIN), ["OUT"])
    board.ready_steps([board.put("IN", "in")])
    board.take_inputs(StepRun(0, 0))
    # "a" streams three responses: "b" runs once per response, in order.
    runs = [board.ready_steps([board.put("T1", f"t{i}")]) for i in range(3)]
    assert runs == [[StepRun(1, 0)], [StepRun(1, 1)], [StepRun(1, 2)]]
    assert board.take_inputs(StepRun(1, 2)) == {"X": "t2"}
    assert board.take_inputs(StepRun(1, 0)) == {"X": "t0"}
    assert board.held() == 1  # only t1, not yet taken
    assert board.ready_outputs([board.put("OUT", "o0")]) == [0]
    assert board.ready_outputs([board.put("OUT", "o1")]) == [1]


def test_a_value_read_by_two_steps_is_kept_until_both_took_it() -> None:
    board: TensorBoard[str] = TensorBoard(EnsembleGraph(FORK), ["OA", "OB"])
    board.put("IN", "in")
    board.take_inputs(StepRun(0, 0))
    assert board.held() == 1
    assert board.take_inputs(StepRun(1, 0)) == {"X": "in"}
    assert board.held() == 0


def test_a_placeholder_value_still_makes_its_reader_ready() -> None:
    """A step output the model left out is an empty value (an optional input downstream)."""
    board: TensorBoard[str | None] = TensorBoard(EnsembleGraph(CHAIN), ["OUT"])
    board.put("IN", "in")
    board.take_inputs(StepRun(0, 0))
    assert board.ready_steps([board.put("T1", None)]) == [StepRun(1, 0)]
    assert board.take_inputs(StepRun(1, 0)) == {"X": None}


def test_a_tensor_nobody_reads_is_not_kept() -> None:
    board: TensorBoard[str] = TensorBoard(EnsembleGraph(FORK), ["OB"])
    assert board.put("OA", "unread") == ("OA", 0)
    assert board.held() == 0


def test_reshape_between_batching_and_non_batching_models() -> None:
    """Triton's ReshapeTensorDims: only where producer and consumer batch differently."""
    # Unbatched [3] into a model batching [3]: gains a batch of 1.
    assert reshape_dims((3,), True, 0, (3,)) == (1, 3)
    # Unbatched [2, 3] already shaped as a batch of a model batching [3]: unchanged.
    assert reshape_dims((3,), True, 0, (2, 3)) == (2, 3)
    # Batch of 1 [1, 3] into a non-batching model of [3]: loses its batch dimension.
    assert reshape_dims((3,), False, 1, (1, 3)) == (3,)
    # ... unless it already fits as it is, or the batch is larger.
    assert reshape_dims((-1, 3), False, 1, (1, 3)) == (1, 3)
    assert reshape_dims((3,), False, 2, (2, 3)) == (2, 3)
    # Same batching on both sides: never changed.
    assert reshape_dims((3,), True, 4, (4, 3)) == (4, 3)
    assert reshape_dims((3,), False, 0, (5,)) == (5,)


def test_step_limits_start_waiting_steps_in_order_as_others_finish() -> None:
    """ensemble_scheduling.max_inflight_requests: at most that many requests of a step at
    once, across the ensemble's requests; the rest start in order as slots free up."""
    limits = StepLimits(2, 1)
    started: list[str] = []

    def start(name: str, wanted: bool = True) -> Callable[[], bool]:
        def go() -> bool:
            if wanted:
                started.append(name)
            return wanted
        return go

    limits.acquire(0, start("a"))
    limits.acquire(0, start("b"))
    limits.acquire(0, start("gone", wanted=False))  # its request ended while it waited
    limits.acquire(0, start("c"))
    limits.acquire(1, start("other step"))  # each step has its own slots
    assert started == ["a", "other step"] and limits.waiting(0) == 3
    limits.release(0)
    assert started == ["a", "other step", "b"]
    limits.release(0)  # "gone" gives its slot back at once, so "c" starts
    assert started == ["a", "other step", "b", "c"]
    assert (limits.running(0), limits.waiting(0)) == (1, 0)


def test_no_limit_starts_every_step_at_once() -> None:
    limits = StepLimits(1, 0)
    started: list[int] = []

    def start() -> bool:
        started.append(len(started))
        return True

    for _ in range(5):
        limits.acquire(0, start)
    assert started == [0, 1, 2, 3, 4] and limits.running(0) == 0
