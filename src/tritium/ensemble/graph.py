"""Which ensemble steps can run: the data flow of a plan and one request's tensors in it.

A value of an ensemble tensor is identified by the tensor's name and an *iteration*: the
n-th value written to that tensor in this request (a decoupled step writes its outputs
once per response). As in Triton's ensemble scheduler, a step runs for iteration ``i``
once each of its inputs has a value for iteration ``i``, and the ensemble answers for
iteration ``i`` once each requested output has one. A value is dropped once every step
(and the response) that reads it has taken it, so a long stream holds no history.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from tritium.ensemble.plan import EnsemblePlan

V = TypeVar("V")

TensorKey = tuple[str, int]  # (ensemble tensor name, iteration)


@dataclass(frozen=True, slots=True, order=True)
class StepRun:
    """One execution of step ``step`` (its index in the plan) for ``iteration``."""

    step: int
    iteration: int


class EnsembleGraph:
    """The plan's tensors and steps as a graph; built once per loaded ensemble."""

    def __init__(self, plan: EnsemblePlan):
        self.plan = plan
        self.readers: dict[str, frozenset[int]] = {}
        self.writer: dict[str, int] = {}
        readers: dict[str, set[int]] = {}
        for index, step in enumerate(plan.steps):
            for tensor in step.input_map.values():
                readers.setdefault(tensor, set()).add(index)
            for tensor in step.output_map.values():
                self.writer[tensor] = index
        self.readers = {name: frozenset(steps) for name, steps in readers.items()}

    def needed_steps(self, outputs: Iterable[str]) -> frozenset[int]:
        """Steps that contribute to ``outputs``: Triton prunes the others when a request
        asks for only some of the ensemble's outputs."""
        needed: set[int] = set()
        pending = [name for name in outputs]
        while pending:
            index = self.writer.get(pending.pop())
            if index is None or index in needed:
                continue
            needed.add(index)
            pending.extend(self.plan.steps[index].input_map.values())
        return frozenset(needed)


class TensorBoard(Generic[V]):
    """The values of one request's ensemble tensors, by iteration."""

    def __init__(self, graph: EnsembleGraph, requested: Sequence[str]):
        self._graph = graph
        self._requested = tuple(requested)
        self._needed = graph.needed_steps(requested)
        self._values: dict[str, dict[int, V]] = {}
        self._written: dict[str, int] = {}
        # How many takers a value of each tensor has: the needed steps reading it, and the
        # response when it is a requested output. A tensor with none is not kept.
        self._takers: dict[str, int] = {}
        for name, steps in graph.readers.items():
            self._takers[name] = len(steps & self._needed)
        for name in self._requested:
            self._takers[name] = self._takers.get(name, 0) + 1
        self._left: dict[TensorKey, int] = {}

    @property
    def needed(self) -> frozenset[int]:
        return self._needed

    def put(self, tensor: str, value: V) -> TensorKey:
        """Write the next value of ``tensor``; returns the key it was written under."""
        iteration = self._written.get(tensor, 0)
        self._written[tensor] = iteration + 1
        takers = self._takers.get(tensor, 0)
        if takers:
            self._values.setdefault(tensor, {})[iteration] = value
            self._left[(tensor, iteration)] = takers
        return (tensor, iteration)

    def ready_steps(self, updated: Iterable[TensorKey]) -> list[StepRun]:
        """The needed steps that ``updated`` made ready, in plan order."""
        ready: set[StepRun] = set()
        steps = self._graph.plan.steps
        for tensor, iteration in updated:
            for index in self._graph.readers.get(tensor, ()):
                if index in self._needed and self._has_all(
                        steps[index].input_map.values(), iteration):
                    ready.add(StepRun(index, iteration))
        return sorted(ready)

    def take_inputs(self, run: StepRun) -> dict[str, V]:
        """The values ``run`` reads, by the step model's input names; each is released."""
        step = self._graph.plan.steps[run.step]
        values = {name: self._values[tensor][run.iteration]
                  for name, tensor in step.input_map.items()}
        for tensor in set(step.input_map.values()):
            self._release((tensor, run.iteration))
        return values

    def ready_outputs(self, updated: Iterable[TensorKey]) -> list[int]:
        """Iterations for which ``updated`` completed every requested output."""
        iterations = {iteration for tensor, iteration in updated if tensor in self._requested}
        return sorted(i for i in iterations if self._has_all(self._requested, i))

    def take_outputs(self, iteration: int) -> dict[str, V]:
        """The requested outputs' values for ``iteration``, by ensemble output name."""
        values = {name: self._values[name][iteration] for name in self._requested}
        for name in self._requested:
            self._release((name, iteration))
        return values

    def held(self) -> int:
        """Values kept for a taker that has not taken them yet."""
        return len(self._left)

    def _has_all(self, tensors: Iterable[str], iteration: int) -> bool:
        return all(iteration in self._values.get(tensor, ()) for tensor in tensors)

    def _release(self, key: TensorKey) -> None:
        left = self._left[key] - 1
        if left:
            self._left[key] = left
            return
        del self._left[key]
        del self._values[key[0]][key[1]]


def reshape_dims(config_dims: Sequence[int], batching: bool, batch_size: int,
                 dims: Sequence[int]) -> tuple[int, ...]:
    """The shape a tensor takes on its way into a model (or out of the ensemble) whose
    batching differs from the producer's, as Triton's ensemble does: a tensor made
    without a batch dimension (``batch_size`` 0) gains a leading 1 if its shape is what a
    batching consumer declares per item; a batched tensor of batch 1 loses its batch
    dimension if its shape does not already fit a non-batching consumer."""
    shape = tuple(dims)
    if batching == (batch_size != 0):
        return shape
    if batching:
        return (1, *shape) if _fits(config_dims, shape) else shape
    if batch_size == 1 and not _fits(config_dims, shape):
        return shape[1:]
    return shape


def _fits(config_dims: Sequence[int], dims: Sequence[int]) -> bool:
    return len(config_dims) == len(dims) and all(
        want == -1 or want == got for want, got in zip(config_dims, dims, strict=True))
