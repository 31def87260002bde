"""What the python backend reads of a model's configuration is the same whether it gets the
protobuf (a thread instance) or the JSON form (an instance process, without protobuf)."""

from __future__ import annotations

import json

import pytest
from google.protobuf import text_format

from tritium.backends.python.loader import Declared
from tritium.core.config_pb import model_config_pb2
from tritium.repository.config import config_to_json

CONFIGS = {
    "plain": 'name: "m" output [{ name: "OUT" data_type: TYPE_FP32 dims: [1] }]',
    "decoupled": 'name: "m" default_model_filename: "other.py" '
                 'model_transaction_policy { decoupled: true } '
                 'output [{ name: "B" data_type: TYPE_FP32 dims: [1] }, '
                 '{ name: "A" data_type: TYPE_INT32 dims: [2] }]',
    "iterative": 'name: "m" sequence_batching { iterative_sequence: true }',
}


@pytest.mark.parametrize("text", CONFIGS.values(), ids=CONFIGS.keys())
def test_both_forms_declare_the_same(text: str) -> None:
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    from_json = Declared.of(json.loads(json.dumps(config_to_json(config))))
    assert from_json == Declared.of(config)


def test_what_each_field_becomes() -> None:
    config = text_format.Parse(CONFIGS["decoupled"], model_config_pb2.ModelConfig())
    assert Declared.of(config_to_json(config)) == Declared("other.py", ["B", "A"], True, False)
    iterative = text_format.Parse(CONFIGS["iterative"], model_config_pb2.ModelConfig())
    assert Declared.of(config_to_json(iterative)) == Declared("model.py", [], False, True)
