"""The shape of an ensemble, read once from its ``ensemble_scheduling``: what the loader
validates and the runtime executes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tritium.core.names import qualified


@dataclass(frozen=True, slots=True)
class EnsembleStep:
    """One ``step`` of ``ensemble_scheduling``."""

    model_name: str
    model_version: int  # -1: the latest ready version, as in Triton
    # The composing model's tensor name -> the ensemble-wide tensor name it reads/writes.
    input_map: Mapping[str, str]
    output_map: Mapping[str, str]
    # The model's repository when other repositories have a model of that name
    # (``--model-namespacing``): Triton's ``model_namespace``, set at load.
    model_namespace: str = ""

    @property
    def model_key(self) -> str:
        """How the server finds the step's model (its name, unless namespaced)."""
        if not self.model_namespace:
            return self.model_name
        return qualified(self.model_name, self.model_namespace)


@dataclass(frozen=True, slots=True)
class EnsemblePlan:
    name: str
    steps: tuple[EnsembleStep, ...]
    inputs: tuple[str, ...]  # the ensemble's own inputs, in config order
    outputs: tuple[str, ...]  # the ensemble's own outputs, in config order

    @property
    def composing_models(self) -> tuple[str, ...]:
        """Each composing model's key once, in step order."""
        return tuple(dict.fromkeys(step.model_key for step in self.steps))

    @classmethod
    def from_config(cls, config: Any) -> EnsemblePlan:
        """The plan as written in ``config`` (a ModelConfig); structure only, no checks."""
        steps = tuple(
            EnsembleStep(
                model_name=step.model_name,
                # As Triton reads it: an omitted version is 0, a version no model has,
                # so the ensemble is refused at load; only -1 means the latest.
                model_version=step.model_version,
                input_map=dict(step.input_map),
                output_map=dict(step.output_map),
                model_namespace=step.model_namespace,
            )
            for step in config.ensemble_scheduling.step
        )
        return cls(
            name=config.name,
            steps=steps,
            inputs=tuple(tensor.name for tensor in config.input),
            outputs=tuple(tensor.name for tensor in config.output),
        )
