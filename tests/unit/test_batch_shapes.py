"""The batchers' equal-shape rule (Triton's RequiredEqualInputs): variable-size inputs that
do not allow ragged batches, and the inputs of a model with optional ones."""

from __future__ import annotations

import dataclasses

import numpy as np
from tritonclient.grpc import model_config_pb2

from tests.unit.admitted import admit
from tritium.core.request import AdmittedRequest, InferenceRequest
from tritium.core.types import DataType, Tensor
from tritium.scheduling.batcher import Batcher, BatchPlan
from tritium.scheduling.policy import SchedulerPolicy

T0 = 1_000_000_000


def request(**shapes: tuple[int, ...]) -> AdmittedRequest:
    inputs = {name: Tensor(name, DataType.FP32, shape, np.zeros(shape, np.float32))
              for name, shape in shapes.items()}
    return admit(InferenceRequest(model_name="m", inputs=inputs), 1, T0)


def config(*inputs: str) -> SchedulerPolicy:
    """A batching model whose inputs are given as text: ``NAME:dims[:ragged][:optional]``."""
    message = model_config_pb2.ModelConfig(name="m", max_batch_size=8)
    message.dynamic_batching.SetInParent()
    for spec in inputs:
        name, dims, *flags = spec.split(":")
        message.input.add(name=name, data_type=model_config_pb2.TYPE_FP32,
                          dims=[int(d) for d in dims.split(",")],
                          allow_ragged_batch="ragged" in flags, optional="optional" in flags)
    return SchedulerPolicy.from_config(message)


def test_only_variable_inputs_without_ragged_batching_must_agree() -> None:
    policy = config("A:-1", "B:4", "C:-1:ragged")
    assert policy.equal_shape_inputs == ("A",) and not policy.optional_inputs
    assert config("A:-1:optional").optional_inputs


def test_a_request_of_another_shape_closes_the_batch() -> None:
    batcher = Batcher(dataclasses.replace(config("A:-1"), max_queue_delay_us=1_000_000))
    queued = [request(A=(1, 3)), request(A=(1, 3)), request(A=(1, 5)), request(A=(1, 3))]
    # The batch goes at once, without waiting for the delay: it cannot grow.
    assert batcher.plan(queued, T0) == BatchPlan(2)
    assert batcher.plan(queued[2:], T0) == BatchPlan(1)


def test_ragged_inputs_batch_whatever_their_shapes() -> None:
    batcher = Batcher(config("A:-1:ragged", "B:2"))
    queued = [request(A=(1, 3), B=(1, 2)), request(A=(1, 5), B=(1, 2))]
    assert batcher.plan(queued, T0) == BatchPlan(2)


def test_the_batch_dimension_is_not_compared() -> None:
    batcher = Batcher(config("A:-1"))
    assert batcher.plan([request(A=(2, 3)), request(A=(1, 3))], T0) == BatchPlan(2)


def test_with_optional_inputs_a_batch_carries_the_same_inputs() -> None:
    batcher = Batcher(config("A:4", "B:4:optional"))
    queued = [request(A=(1, 4)), request(A=(1, 4), B=(1, 4)), request(A=(1, 4))]
    assert batcher.plan(queued, T0) == BatchPlan(1)
    assert batcher.plan(queued[1:], T0) == BatchPlan(1)
