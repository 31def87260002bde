"""The rate limiter: resource pools (per device, global, given counts) and the order in
which staged instances run (priority weighting, head of line)."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from tests.unit.admitted import admit
from tritium.core.errors import TritiumError
from tritium.core.request import SEQUENCE_END, SEQUENCE_START, AdmittedRequest, InferenceRequest
from tritium.scheduling.clock import ManualClock
from tritium.scheduling.policy import SchedulerPolicy, SequencePolicy
from tritium.scheduling.rate_limiter import Gate, RateLimiter
from tritium.scheduling.resources import GLOBAL, ResourceNeed, ResourcePool
from tritium.scheduling.sequences import SequenceScheduler


def needs(*entries: tuple[str, int] | tuple[str, int, bool]) -> list[ResourceNeed]:
    return [ResourceNeed(*entry) for entry in entries]


# -- pools -----------------------------------------------------------------------------
def test_pools_default_to_the_most_any_instance_needs() -> None:
    pool = ResourcePool()
    pool.add("A", 0, needs(("R1", 4), ("R2", 4)))
    pool.add("B", 0, needs(("R2", 5), ("R3", 10), ("R4", 5)))
    pool.add("C", 0, needs(("R1", 1), ("R3", 7), ("R4", 2)))
    assert pool.limits() == {0: {"R1": 4, "R2": 5, "R3": 10, "R4": 5}}
    pool.remove("B")
    assert pool.limits() == {0: {"R1": 4, "R2": 4, "R3": 7, "R4": 2}}


def test_given_counts_per_device_every_device_and_global() -> None:
    # Triton's documented example: R1 on every device, R2 per device, R3 global.
    pool = ResourcePool([("R1", 10, -1), ("R2", 5, 0), ("R2", 8, 1), ("R3", 2, -1)])
    for device in (0, 1):
        pool.add(f"i{device}", device, needs(("R1", 1), ("R2", 1), ("R3", 1, True)))
    assert pool.limits() == {GLOBAL: {"R3": 2}, 0: {"R1": 10, "R2": 5}, 1: {"R1": 10, "R2": 8}}


def test_a_name_given_twice_on_a_device_keeps_the_smaller_count() -> None:
    pool = ResourcePool([("R", 6, -1), ("R", 3, -1)])
    pool.add("a", 0, needs(("R", 1)))
    assert pool.limits() == {0: {"R": 3}}


def test_an_instance_needing_more_than_given_is_refused_with_tritons_text() -> None:
    pool = ResourcePool([("R1", 2, -1)])
    pool.add("small", 0, needs(("R1", 2)))
    with pytest.raises(TritiumError) as refused:
        pool.add("big", 0, needs(("R1", 3)))
    assert refused.value.message == (
        'Resource count for "R1" is limited to 2 which will prevent scheduling of one or '
        "more model instances, the minimum required count is 3")
    assert pool.limits() == {0: {"R1": 2}}  # the refused instance left nothing behind
    with pytest.raises(TritiumError, match='"R9" is limited to 0'):
        pool.add("other", 0, needs(("R9", 1)))  # counts were given, none for R9


def test_a_resource_both_global_and_per_device_is_refused() -> None:
    pool = ResourcePool()
    pool.add("a", 0, needs(("R", 1, True)))
    with pytest.raises(TritiumError, match='Resource "R" is present as both global and '
                                           "device-specific resource"):
        pool.add("b", 0, needs(("R", 1)))


def test_per_device_pools_are_separate_and_global_ones_shared() -> None:
    pool = ResourcePool()
    pool.add("d0", 0, needs(("R", 1)))
    pool.add("d1", 1, needs(("R", 1)))
    pool.add("g0", 0, needs(("G", 1, True)))
    pool.add("g1", 1, needs(("G", 1, True)))
    assert pool.try_take("d0") and pool.try_take("d1")  # one R on each device
    assert pool.try_take("g0") and not pool.try_take("g1")  # one G for both
    pool.give_back("g0")
    assert pool.try_take("g1")


def test_take_is_all_or_nothing_and_give_back_returns_it() -> None:
    pool = ResourcePool()
    pool.add("ab", 0, needs(("A", 1), ("B", 1)))
    pool.add("b", 0, needs(("B", 1)))
    pool.add("a", 0, needs(("A", 1)))
    assert pool.try_take("b")
    assert not pool.try_take("ab")
    assert pool.try_take("a")  # "ab" took none of A when B was missing
    pool.give_back("a")
    pool.give_back("b")
    pool.give_back("b")  # giving back twice returns nothing more
    assert pool.try_take("ab") and not pool.try_take("a") and not pool.try_take("b")
    pool.remove("ab")  # a removed holder returns what it held
    assert pool.try_take("a") and pool.try_take("b")


# -- staged instances ------------------------------------------------------------------
class Recorder:
    def __init__(self, name: str, ran: list[str]):
        self.name = name
        self._ran = ran

    def submit(self, batch: list[AdmittedRequest]) -> None:
        self._ran.append(self.name)


def rate_limiter_config(text: str) -> Any:
    return text_format.Parse(text, pb.ModelRateLimiter())


def gates(limiter: RateLimiter, ran: list[str], specs: dict[str, str],
          done: list[str] | None = None) -> dict[str, Gate]:
    made = {}
    for name, text in specs.items():
        gate = limiter.gate(name, 0, rate_limiter_config(text))
        gate.instance = Recorder(name, ran)
        gate.target = lambda g, *_: done.append(g.name) if done is not None else None
        made[name] = gate
    return made


def batch() -> list[AdmittedRequest]:
    return [admit(InferenceRequest(model_name="m", inputs={}))]


def test_one_resource_of_count_one_runs_one_instance_at_a_time() -> None:
    limiter, ran, done = RateLimiter(), list[str](), list[str]()
    one = 'resources [ { name: "R" count: 1 } ]'
    g = gates(limiter, ran, {"a": one, "b": one}, done)
    g["a"].submit(batch())
    g["b"].submit(batch())
    assert ran == ["a"] and limiter.staged() == ["b"]
    g["a"].finished(None, [], 10)
    assert ran == ["a", "b"] and done == ["a"] and limiter.staged() == []


def test_instances_without_resources_run_at_once() -> None:
    limiter, ran = RateLimiter(), list[str]()
    g = gates(limiter, ran, {"a": "", "b": ""})
    g["a"].submit(batch())
    g["b"].submit(batch())
    assert ran == ["a", "b"]


def test_priority_weighting_orders_staged_instances() -> None:
    # "fast" (priority 1) and "slow" (priority 3) always have work and contend for one R:
    # the lower runs x priority goes first (the earlier staged on a tie), so "slow" gets
    # one run in four. An instance that finishes stages again before the R it held is
    # given out, as a scheduler with work queued does.
    limiter, ran = RateLimiter(), list[str]()
    one = 'resources [ { name: "R" count: 1 } ]'
    g = gates(limiter, ran, {"first": one, "slow": f"{one} priority: 3",
                             "fast": f"{one} priority: 1"})

    def again(gate: Gate, *_: Any) -> None:
        if gate.name != "first" and len(ran) < 10:
            gate.submit(batch())

    for gate in g.values():
        gate.target = again
        gate.submit(batch())
    while len(ran) < 10:
        g[ran[-1]].finished(None, [], 1)
    assert ran == ["first", "slow", "fast", "fast", "fast", "slow", "fast", "fast", "fast",
                   "slow"]


def test_the_first_staged_instance_blocks_those_behind_it() -> None:
    limiter, ran = RateLimiter(), list[str]()
    g = gates(limiter, ran, {
        "big": 'resources [ { name: "R" count: 2 } ]',
        "small": 'resources [ { name: "R" count: 1 } ]',
        "free": ""})
    g["small"].submit(batch())
    g["small"].finished(None, [], 1)  # small ran once: it stages behind big from now on
    g["small"].submit(batch())  # holds one R again
    g["big"].submit(batch())  # needs both: waits
    g["free"].submit(batch())  # needs nothing, but big is first in line
    assert ran == ["small", "small"] and limiter.staged() == ["big", "free"]
    g["small"].finished(None, [], 1)
    assert ran == ["small", "small", "big", "free"]


def test_a_removed_gate_hands_its_held_batch_to_its_instance() -> None:
    limiter, ran = RateLimiter(), list[str]()
    one = 'resources [ { name: "R" count: 1 } ]'
    g = gates(limiter, ran, {"a": one, "b": one})
    g["a"].submit(batch())
    g["b"].submit(batch())
    limiter.remove(g["b"])
    assert ran == ["a", "b"] and limiter.staged() == []
    g["a"].finished(None, [], 1)  # nothing staged to run after it
    assert ran == ["a", "b"]


def test_warmup_batches_pass_through_without_resources() -> None:
    limiter, ran, done = RateLimiter(), list[str](), list[str]()
    g = gates(limiter, ran, {"a": 'resources [ { name: "R" count: 1 } ]'}, done)
    g["a"].finished(None, [], 1)  # a batch the gate never staged
    assert done == ["a"] and g["a"].runs == 0
    g["a"].submit(batch())
    assert ran == ["a"]


# -- behind a scheduler ----------------------------------------------------------------
class Recording:
    def __init__(self) -> None:
        self.batches: list[list[AdmittedRequest]] = []

    def submit(self, batch: list[AdmittedRequest]) -> None:
        self.batches.append(batch)


def sequence_request(name: str, correlation_id: int, flags: int) -> AdmittedRequest:
    return admit(InferenceRequest(model_name="acc", inputs={}, id=name,
                                  correlation_id=correlation_id, flags=flags))


def test_sequence_schedulers_take_turns_on_a_shared_resource() -> None:
    limiter = RateLimiter()
    one = rate_limiter_config('resources [ { name: "R" count: 1 } ]')
    schedulers: list[SequenceScheduler] = []
    instances: list[tuple[Gate, Recording]] = []
    for name in ("a", "b"):
        policy = SchedulerPolicy(sequence=SequencePolicy(max_idle_us=1_000_000))
        scheduler = SequenceScheduler(name, 1, policy, clock=ManualClock())
        gate, recording = limiter.gate(f"{name}_0", 0, one), Recording()
        gate.instance, gate.target = recording, scheduler.batch_done
        scheduler.add_instances([gate])
        schedulers.append(scheduler)
        instances.append((gate, recording))
    for scheduler in schedulers:
        scheduler.enqueue(sequence_request(f"{scheduler.model_name}1", 7, SEQUENCE_START))
        scheduler.enqueue(sequence_request(f"{scheduler.model_name}2", 7, SEQUENCE_END))
    ran: list[str] = []
    for _ in range(4):
        running = [(g, r) for g, r in instances if len(r.batches) > g.runs]
        assert len(running) == 1, "one R: one instance at a time"
        gate, recording = running[0]
        ran.append(recording.batches[-1][0].request.id)
        gate.finished(None, recording.batches[-1], 1000)
    assert ran == ["a1", "b1", "a2", "b2"]  # each sequence in order, the two alternating
    assert all(s.is_idle() for s in schedulers)
