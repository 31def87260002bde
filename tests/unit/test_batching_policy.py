"""config.pbtxt → scheduler policy, instance names and devices, the queue's delayed lane."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from tests.unit.admitted import admit
from tritium.core.request import AdmittedRequest, InferenceRequest
from tritium.repository.config import ConfigError, complete_model_config
from tritium.repository.loaded import LoadedModel
from tritium.scheduling.policy import (
    QueuePolicy,
    SchedulerPolicy,
    TimeoutAction,
    TimeoutOverride,
)
from tritium.scheduling.queue import RequestQueue

IO = """
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


def completed(tmp_path: Path, text: str, name: str = "m") -> Any:
    model_dir = tmp_path / name
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    config = text_format.Parse(f'backend: "python"\n{IO}{text}', pb.ModelConfig())
    return complete_model_config(model_dir, config, None)


def test_policy_from_a_full_dynamic_batching_config(tmp_path: Path) -> None:
    config = completed(tmp_path, """
        max_batch_size: 16
        dynamic_batching {
          preferred_batch_size: [ 4, 8 ]
          max_queue_delay_microseconds: 500
          priority_levels: 3
          default_priority_level: 2
          default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 7
                                 allow_timeout_override: true max_queue_size: 5 }
          priority_queue_policy { key: 1 value { max_queue_size: 2 } }
        }
    """)
    policy = SchedulerPolicy.from_config(config)
    assert policy.dynamic_batching and policy.max_batch_size == 16
    assert policy.preferred_batch_sizes == (4, 8) and policy.max_queue_delay_us == 500
    assert policy.priority_levels == 3 and policy.default_priority == 2
    default = QueuePolicy(TimeoutAction.DELAY, 7, TimeoutOverride.ALLOW, 5)
    assert policy.level_policies() == [QueuePolicy(max_queue_size=2), default, default]
    assert policy.batch_limit() == 8 and policy.has_timeouts()


def test_empty_preferred_sizes_become_max_batch_size(tmp_path: Path) -> None:
    policy = SchedulerPolicy.from_config(completed(tmp_path, "max_batch_size: 8\n"
                                                             "dynamic_batching {}\n"))
    assert policy.preferred_batch_sizes == (8,) and policy.batch_limit() == 8
    assert not policy.has_timeouts()


def test_default_scheduler_has_no_batching_and_no_queue_policy(tmp_path: Path) -> None:
    policy = SchedulerPolicy.from_config(completed(tmp_path, "max_batch_size: 8\n"))
    assert policy == SchedulerPolicy(max_batch_size=8)
    assert policy.batch_limit() == 1


def test_request_timeout_override_rules() -> None:
    allow = QueuePolicy(default_timeout_us=100, timeout_override=TimeoutOverride.ALLOW)
    deny = QueuePolicy(default_timeout_us=100)
    assert allow.timeout_us(0) == 100 and allow.timeout_us(30) == 30
    assert allow.timeout_us(500) == 100  # only lowers
    assert deny.timeout_us(30) == 100
    assert QueuePolicy(timeout_override=TimeoutOverride.ALLOW).timeout_us(30) == 0


def instance_infos(tmp_path: Path, groups: str) -> list[tuple[str, str, int]]:
    config = completed(tmp_path, groups, name="pool_model")
    model = LoadedModel(tmp_path / "pool_model", 1, config)
    return [(i.instance_name, i.kind, i.device_id) for i, _ in model._instance_infos("{}")]


def test_instances_are_named_after_their_group(tmp_path: Path) -> None:
    infos = instance_infos(tmp_path, """
        instance_group [ { name: "pool" count: 2 kind: KIND_CPU },
                         { count: 1 kind: KIND_MODEL },
                         { count: 2 kind: KIND_AUTO } ]
    """)
    assert infos == [("pool_0", "CPU", 0), ("pool_1", "CPU", 0),
                     ("pool_model_1_0", "MODEL", 0),
                     ("pool_model_2_0", "CPU", 0), ("pool_model_2_1", "CPU", 0)]


def test_default_instance_group_is_one_cpu_instance_named_after_the_model(tmp_path: Path) -> None:
    assert instance_infos(tmp_path, "") == [("pool_model_0", "CPU", 0)]


def test_gpu_instance_group_is_a_load_error_without_a_gpu(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="KIND_GPU requested but no GPU is available"):
        completed(tmp_path, 'instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0 ] } ]\n')


def request(name: str, priority: int = 0) -> AdmittedRequest:
    return admit(InferenceRequest(model_name="m", inputs={}, id=name, priority=priority))


def test_delayed_request_goes_after_its_level_but_before_lower_levels() -> None:
    queue = RequestQueue(priority_levels=2, default_priority=1)
    a, b, c, low = request("a"), request("b"), request("c"), request("low", 2)
    for r in (a, b, low, c):
        queue.push(r)
    assert queue.delay(a) and not queue.delay(a)
    assert [r.request.id for r in queue] == ["b", "c", "a", "low"]
    assert len(queue) == 4 and queue.level_size(0) == 3
    assert [r.request.id for r in queue.drain()] == ["b", "c", "a", "low"]
    assert queue.pop() is None


def test_discarding_a_delayed_request_removes_it_once() -> None:
    queue = RequestQueue()
    a, b = request("a"), request("b")
    queue.push(a)
    queue.push(b)
    queue.delay(a)
    assert queue.discard(a) and not queue.discard(a)
    assert len(queue) == 1
    assert [r.request.id for r in queue.drain()] == ["b"]
    assert not queue._moved  # nothing left behind once the queue has passed over it
