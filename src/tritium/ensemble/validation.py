"""Checks an ensemble's config as Triton does, in two stages, with Triton's messages.

- ``validate_ensemble_scheduling(config)``: what the ensemble's own config shows (Triton's
  config validation): steps complete, every ensemble input used, every output written,
  no tensor unused, no tensor written twice. A cycle between steps shows up here, as an
  output "not written" or a tensor "unused": its tensors never become ready.
- ``validate_against_composing(config, composing)``: once the composing models are loaded
  and their configs complete: mapped tensors exist, datatypes and shapes agree between
  steps, ``max_batch_size`` fits, and decoupled steps do not merge. Returns whether the
  ensemble is decoupled (a decoupled step lies on its path), as Triton sets it.

The texts reproduce Triton's, stray quotes included, so logs and clients that look for
them find them. Pure functions: no server, no files.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tritium.core.config_pb import model_config_pb2 as pb
from tritium.core.errors import ErrorCode, TritiumError

ENSEMBLE_PLATFORM = "ensemble"
WILDCARD_DIM = -1
# tritium's bounds, where Triton has none: each step is an execution per request and is
# checked at load on the event loop; each level of nesting is a level of loading.
MAX_STEPS = 1024
MAX_DEPTH = 32


class EnsembleConfigError(TritiumError):
    """An ensemble that cannot load (INVALID_ARG, as every ensemble error in Triton)."""

    def __init__(self, message: str):
        super().__init__(ErrorCode.INVALID_ARG, message)


def is_ensemble(config: Any) -> bool:
    return bool(config.platform == ENSEMBLE_PLATFORM or config.HasField("ensemble_scheduling"))


# -- stage 1: the ensemble's own config ---------------------------------------------------
def validate_ensemble_scheduling(config: Any) -> None:
    """Raise EnsembleConfigError unless ``config``'s ensemble_scheduling is well formed."""
    name = config.name
    if not config.HasField("ensemble_scheduling"):
        if config.platform == ENSEMBLE_PLATFORM:
            raise EnsembleConfigError(
                f"ensemble scheduling must be set for ensemble {name} whose platform is "
                f"{ENSEMBLE_PLATFORM}"
            )
        return
    _check_ensemble_fields(config)
    graph = _FlowGraph.build(config)
    graph.check_flow(config)


def _check_ensemble_fields(config: Any) -> None:
    name = config.name
    if config.platform != ENSEMBLE_PLATFORM:
        raise EnsembleConfigError(
            f"ensemble scheduling cannot be set for model '{name}' whose platform is not "
            f"{ENSEMBLE_PLATFORM}"
        )
    if len(config.instance_group):
        raise EnsembleConfigError(f"instance group should not be specified for ensemble '{name}'")
    if config.HasField("optimization"):
        raise EnsembleConfigError(f"optimization should not be specified for ensemble '{name}'")
    if len(config.model_warmup):
        raise EnsembleConfigError(f"model_warmup can not be specified for ensemble '{name}'")
    if not config.ensemble_scheduling.step:
        raise EnsembleConfigError(f"must specify 'step' for ensemble '{name}'")
    if len(config.ensemble_scheduling.step) > MAX_STEPS:
        raise EnsembleConfigError(f"ensemble '{name}' has {len(config.ensemble_scheduling.step)}"
                                  f" steps, more than the {MAX_STEPS} allowed")


@dataclass(eq=False)
class _FlowNode:
    """An ensemble tensor in the data-flow graph: written by at most one step."""

    name: str
    written: bool
    ready: bool = False
    prev: list[_FlowNode] = field(default_factory=list)
    next: list[_FlowNode] = field(default_factory=list)


class _FlowGraph:
    """Tensors linked from each step's inputs to its outputs (Triton's BuildEnsembleGraph)."""

    def __init__(self) -> None:
        self.tensors: dict[str, _FlowNode] = {}

    @classmethod
    def build(cls, config: Any) -> _FlowGraph:
        graph = cls()
        for index, step in enumerate(config.ensemble_scheduling.step):
            graph._add_step(config.name, index, step)
        return graph

    def _add_step(self, ensemble: str, index: int, step: Any) -> None:
        where = f"in step {index} of ensemble '{ensemble}'"
        for field_name in ("model_name", "input_map", "output_map"):
            if not getattr(step, field_name):
                raise EnsembleConfigError(f"must specify '{field_name}' {where}")
        written: list[_FlowNode] = []
        for tensor in step.output_map.values():
            node = self.tensors.get(tensor)
            if node is not None and node.written:
                raise EnsembleConfigError(
                    f"ensemble tensor '{tensor}' can appear in an output map only once for "
                    f"ensemble '{ensemble}' step {index}"
                )
            if node is None:
                node = self.tensors[tensor] = _FlowNode(tensor, written=True)
            node.written = True
            written.append(node)
        for tensor in step.input_map.values():
            source = self.tensors.setdefault(tensor, _FlowNode(tensor, written=False))
            for output in written:
                output.prev.append(source)
                source.next.append(output)

    def check_flow(self, config: Any) -> None:
        name = config.name
        queue: deque[_FlowNode] = deque()
        for tensor in config.input:
            node = self.tensors.get(tensor.name)
            if node is None:
                # Triton's text has the unmatched quote after the ensemble's name.
                raise EnsembleConfigError(
                    f"ensemble input '{tensor.name}' for ensemble {name}' is not used")
            node.ready = True
            queue.append(node)
        _spread_ready(queue)
        outputs = {self._check_output(name, tensor.name) for tensor in config.output}
        for tensor, node in self.tensors.items():
            if tensor not in outputs and (not node.ready or not node.next):
                raise EnsembleConfigError(
                    f"ensemble tensor '{tensor}' is unused in ensemble '{name}'")

    def _check_output(self, ensemble: str, output: str) -> str:
        node = self.tensors.get(output)
        if node is None:
            raise EnsembleConfigError(
                f"ensemble output '{output}' for ensemble {ensemble}' is not used")
        if node.ready:
            return output
        message = f"output '{output}' for ensemble '{ensemble}' is not written"
        source = _unready_source(node)
        if source.name != node.name:
            message += f": at least one of its depending tensors, '{source.name}', is not connected"
        raise EnsembleConfigError(message)


def _spread_ready(queue: deque[_FlowNode]) -> None:
    """A tensor is ready once every input of the step that writes it is."""
    while queue:
        node = queue.popleft()
        for after in node.next:
            if not after.ready and all(before.ready for before in after.prev):
                after.ready = True
                queue.append(after)


def _unready_source(node: _FlowNode) -> _FlowNode:
    """Follow not-ready inputs upstream to the first one nothing feeds (cycles stop it)."""
    last, seen = node, set()
    prev: list[_FlowNode] | None = node.prev
    while prev:
        candidates, prev = prev, None
        for before in candidates:
            if not before.ready and before.name not in seen:
                seen.add(before.name)
                last, prev = before, before.prev
                break
    return last


# -- stage 2: against the composing models' configs -----------------------------------------
@dataclass(eq=False)
class _TensorNode:
    """An ensemble tensor's datatype and shape as first inferred, and its decoupled origin."""

    model: str
    datatype: int = 0
    dims: tuple[int, ...] = ()
    full_dims: tuple[int, ...] = ()
    decoupled: bool = False
    label: int = 0
    visited: bool = False
    prev: list[_TensorNode] = field(default_factory=list)
    next: list[_TensorNode] = field(default_factory=list)
    # Shared by the outputs of one step, so they all carry the same decoupled label.
    sibling: _TensorNode | None = None

    @classmethod
    def of(cls, model: str, batching: bool, datatype: int, dims: Iterable[int]) -> _TensorNode:
        shape = tuple(dims)
        full = ((WILDCARD_DIM,) if batching else ()) + shape
        return cls(model, datatype, shape, full)


def validate_against_composing(config: Any, composing: Mapping[str, Any]) -> bool:
    """Check the ensemble ``config`` against its composing models' completed configs
    (``composing``: model name -> ModelConfig); returns whether the ensemble is decoupled.

    Every step's model must be in ``composing``; the loader makes sure of that first.
    """
    name = config.name
    batching = config.max_batch_size > 0
    tensors: dict[str, _TensorNode] = {}
    for tensor in config.input:
        tensors[tensor.name] = _TensorNode.of(name, batching, tensor.data_type, _shape(tensor))
    sink = _TensorNode(name)
    for tensor in config.output:
        node = tensors.setdefault(
            tensor.name, _TensorNode.of(name, batching, tensor.data_type, _shape(tensor)))
        sink.prev.append(node)
        node.next.append(sink)
    for step in config.ensemble_scheduling.step:
        model_config = composing[step.model_name]
        _check_batch_size(config, step.model_name, model_config)
        _map_step(name, step, model_config, tensors)
    return _label_decoupled(name, [tensors[t.name] for t in config.input])


def _shape(tensor: Any) -> Sequence[int]:
    return tensor.reshape.shape if tensor.HasField("reshape") else tensor.dims


def _check_batch_size(config: Any, model: str, model_config: Any) -> None:
    # A batching ensemble may hold non-batching models (max_batch_size 0).
    limit = model_config.max_batch_size
    if limit != 0 and limit < config.max_batch_size:
        raise EnsembleConfigError(
            f"ensemble {config.name} allows maximum batch size {config.max_batch_size}, but "
            f"it contains model {model} which only allows maximum batch size to be {limit}"
        )


def _map_step(ensemble: str, step: Any, model_config: Any,
              tensors: dict[str, _TensorNode]) -> None:
    batching = model_config.max_batch_size > 0
    _map_inputs(ensemble, step, model_config, batching, tensors)
    _map_outputs(ensemble, step, model_config, batching, tensors)
    decoupled = model_config.model_transaction_policy.decoupled
    for tensor in step.output_map.values():
        node = tensors[tensor]
        node.decoupled = decoupled
        for source in step.input_map.values():
            before = tensors[source]
            node.prev.append(before)
            before.next.append(node)


def _map_inputs(ensemble: str, step: Any, model_config: Any, batching: bool,
                tensors: dict[str, _TensorNode]) -> None:
    model = step.model_name
    declared = {tensor.name: tensor for tensor in model_config.input}
    for model_input, tensor in step.input_map.items():
        if model_input not in declared:
            raise EnsembleConfigError(
                f"in ensemble {ensemble}, ensemble tensor {tensor} is mapping to "
                f"non-existing input {model_input} in model {model}"
            )
    for model_input in model_config.input:
        tensor = step.input_map.get(model_input.name)
        if tensor is None:
            if model_input.optional:
                continue  # an optional input may be left out of the ensemble
            raise EnsembleConfigError(
                f"in ensemble {ensemble}, input {model_input.name} in model {model} is not "
                "mapped to any ensemble tensors"
            )
        found = _TensorNode.of(model, batching, model_input.data_type, model_input.dims)
        _merge(ensemble, tensor, found, tensors)


def _map_outputs(ensemble: str, step: Any, model_config: Any, batching: bool,
                 tensors: dict[str, _TensorNode]) -> None:
    model = step.model_name
    declared = {tensor.name: tensor for tensor in model_config.output}
    for model_output, tensor in step.output_map.items():
        if model_output not in declared:
            raise EnsembleConfigError(
                f"in ensemble {ensemble}, ensemble tensor {tensor} is mapped from "
                f"non-existing output {model_output} in model {model}"
            )
    sibling = _TensorNode(model)
    for model_output, tensor in step.output_map.items():
        output = declared[model_output]
        found = _TensorNode.of(model, batching, output.data_type, output.dims)
        _merge(ensemble, tensor, found, tensors).sibling = sibling


def _merge(ensemble: str, tensor: str, found: _TensorNode,
           tensors: dict[str, _TensorNode]) -> _TensorNode:
    """The tensor's node; the first model to name it sets its type and shape."""
    known = tensors.get(tensor)
    if known is None:
        tensors[tensor] = found
        return found
    _check_consistent(known, found, f"in ensemble {ensemble}, ensemble tensor {tensor}: ")
    return known


def _check_consistent(known: _TensorNode, found: _TensorNode, prefix: str) -> None:
    if known.datatype != found.datatype:
        raise EnsembleConfigError(
            f"{prefix}inconsistent data type: {_type_name(known.datatype)} is inferred from "
            f"model {known.model} while {_type_name(found.datatype)} is inferred from model "
            f"{found.model}"
        )
    # Either shape may hold wildcards (checked per request then); a tensor shared by a
    # batching and a non-batching model also matches with the batch dimension added.
    if not (_dims_match(known.dims, found.dims) or _dims_match(known.full_dims, found.full_dims)):
        raise EnsembleConfigError(
            f"{prefix}inconsistent shape: {_dims_text(known.full_dims)} is inferred from model "
            f"{known.model} while {_dims_text(found.full_dims)} is inferred from model "
            f"{found.model}"
        )


def _dims_match(left: Sequence[int], right: Sequence[int]) -> bool:
    return len(left) == len(right) and all(
        a == b or WILDCARD_DIM in (a, b) for a, b in zip(left, right, strict=True))


def _dims_text(dims: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _type_name(datatype: int) -> str:
    return str(pb.DataType.Name(datatype)) if datatype in pb.DataType.values() else str(datatype)


def _label_decoupled(ensemble: str, inputs: list[_TensorNode]) -> bool:
    """Give each tensor the decoupled step it descends from (0: none); a step fed by two
    different decoupled streams cannot pair their responses, so it is refused."""
    labels = 0
    queue: deque[_TensorNode] = deque()
    for node in inputs:
        node.visited = True
        queue.append(node)
    while queue:
        node = queue.popleft()
        for after in node.next:
            if after.visited or not all(before.visited for before in after.prev):
                continue
            inherited = after.prev[0].label
            if any(before.label != inherited for before in after.prev):
                raise EnsembleConfigError(
                    f"in ensemble {ensemble}, step of model '{after.model}' receives inputs "
                    "originated from different decoupled models"
                )
            labels = _assign_label(after, inherited, labels)
            after.visited = True
            queue.append(after)
    return labels != 0


def _assign_label(node: _TensorNode, inherited: int, labels: int) -> int:
    sibling = node.sibling
    if sibling is not None and sibling.visited:
        node.label = sibling.label
        return labels
    if node.decoupled:
        labels += 1
        node.label = labels
    else:
        node.label = inherited
    if sibling is not None:
        sibling.label, sibling.visited = node.label, True
    return labels


# -- dependencies between models (Triton's model repository manager) ------------------------
def unavailable_models(ensemble: str, names: Iterable[str]) -> EnsembleConfigError:
    """Composing models that are not in the repository."""
    return EnsembleConfigError(
        f"ensemble {ensemble} contains models that are not available or ambiguous: "
        + ", ".join(sorted(set(names)))
    )


def dependency_failed(ensemble: str, model: str, error: str) -> EnsembleConfigError:
    """A composing model that failed to load."""
    return EnsembleConfigError(
        f"ensemble '{ensemble}' depends on '{model}' which has no loaded version. Model "
        f"'{model}' loading failed with error: {error}"
    )


def dependency_not_loaded(ensemble: str, model: str) -> EnsembleConfigError:
    return EnsembleConfigError(
        f"ensemble '{ensemble}' depends on '{model}' which has no loaded version.")


def version_not_loaded(ensemble: str, model: str, version: int) -> EnsembleConfigError:
    return EnsembleConfigError(
        f"ensemble '{ensemble}' depends on '{model}' whose required version {version} is not "
        "loaded."
    )


def nested_too_deep(ensemble: str) -> EnsembleConfigError:
    return EnsembleConfigError(f"ensemble '{ensemble}' has ensembles nested more than "
                               f"{MAX_DEPTH} levels deep under it, the most allowed")


def circular_dependency(start: str, current: str) -> EnsembleConfigError:
    """``start`` is reached again from ``current``, one of the ensembles it (indirectly)
    composes."""
    return EnsembleConfigError(
        f"circular dependency between ensembles: {start} -> ... -> {current} -> {start}")
