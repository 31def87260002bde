"""Builds the test model repository: tiny models reused by every end-to-end test."""

from __future__ import annotations

import shutil
from pathlib import Path

MODELS_SOURCE = Path(__file__).parent / "models"
EXAMPLES = Path(__file__).parent.parent / "src" / "tritium" / "example_repository"
DECOUPLED = "model_transaction_policy { decoupled: true }\n"

ALL_DATATYPES = (
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BYTES", "BF16",
)


def _config_type(datatype: str) -> str:
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def _tensor(kind: str, name: str, datatype: str, dims: str, extra: str = "") -> str:
    return (f'{kind} [{{ name: "{name}" data_type: {_config_type(datatype)} dims: [{dims}]'
            f"{extra} }}]\n")


def _parameter(key: str, value: str) -> str:
    return f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'


def add_model(repo: Path, name: str, source: str, config: str, versions: tuple[int, ...] = (1,)
              ) -> Path:
    model_dir = repo / name
    model_dir.mkdir(parents=True, exist_ok=True)
    if config:
        (model_dir / "config.pbtxt").write_text(config)
    for version in versions:
        (model_dir / str(version)).mkdir(exist_ok=True)
        shutil.copy(MODELS_SOURCE / f"{source}.py", model_dir / str(version) / "model.py")
    return model_dir


def build_repository(repo: Path, record_dir: Path) -> Path:
    """Write every test model under ``repo``; models that record write into ``record_dir``."""
    repo.mkdir(parents=True, exist_ok=True)
    for datatype in ALL_DATATYPES:
        add_model(repo, f"identity_{datatype.lower()}", "identity",
                  'backend: "python"\nmax_batch_size: 0\n'
                  + _tensor("input", "INPUT0", datatype, "-1")
                  + _tensor("output", "OUTPUT0", datatype, "-1"))
    add_model(repo, "identity_batch", "identity",
              "max_batch_size: 8\n"
              + _tensor("input", "INPUT0", "FP32", "-1")
              + _tensor("output", "OUTPUT0", "FP32", "-1"))
    add_model(repo, "add_sub", "add_sub",
              'backend: "python"\n'
              + _tensor("input", "INPUT0", "FP32", "16") + _tensor("input", "INPUT1", "FP32", "16")
              + _tensor("output", "OUTPUT0", "FP32", "16")
              + _tensor("output", "OUTPUT1", "FP32", "16")
              + "instance_group [{ count: 2 kind: KIND_CPU }]\n"
              + "version_policy { all {} }\n",
              versions=(1, 2))
    add_model(repo, "raises", "raises",
              _tensor("input", "INPUT0", "FP32", "1") + _tensor("output", "OUTPUT0", "FP32", "1"))
    add_model(repo, "error_response", "error_response",
              _tensor("input", "INPUT0", "BYTES", "1") + _tensor("output", "OUTPUT0", "FP32", "1"))
    add_model(repo, "bad_init", "bad_init",
              _tensor("input", "INPUT0", "FP32", "1") + _tensor("output", "OUTPUT0", "FP32", "1"))
    add_model(repo, "bad_config", "identity", "max_batch_size: -3\ninput [{ name: \"X\" }]\n")
    add_model(repo, "auto_complete", "auto_complete", "")
    add_model(repo, "slow", "slow",
              _tensor("input", "INPUT0", "FP32", "1") + _tensor("output", "OUTPUT0", "FP32", "1")
              + _parameter("record_file", f"{record_dir}/slow.jsonl"))
    add_model(repo, "slow_decoupled", "slow",
              DECOUPLED
              + _tensor("input", "INPUT0", "FP32", "1") + _tensor("output", "OUTPUT0", "FP32", "1")
              + _parameter("record_file", f"{record_dir}/slow.jsonl"))
    # Two instances, so two requests run at once (gRPC stream interleaving tests).
    add_model(repo, "slow_pair", "slow",
              _tensor("input", "INPUT0", "FP32", "1") + _tensor("output", "OUTPUT0", "FP32", "1")
              + "instance_group [{ count: 2 kind: KIND_CPU }]\n"
              + _parameter("record_file", f"{record_dir}/slow_pair.jsonl"))
    add_model(repo, "slow_child", "slow",
              _tensor("input", "INPUT0", "FP32", "1") + _tensor("output", "OUTPUT0", "FP32", "1")
              + _parameter("record_file", f"{record_dir}/slow_child.jsonl"))
    add_model(repo, "repeat", "repeat",
              DECOUPLED
              + _tensor("input", "INPUT0", "INT32", "1")
              + _tensor("input", "DELAY", "FP32", "1", " optional: true")
              + _tensor("output", "OUTPUT0", "INT32", "1"))
    add_model(repo, "decoupled_error", "decoupled_error",
              DECOUPLED
              + _tensor("input", "INPUT0", "FP32", "1") + _tensor("input", "MODE", "BYTES", "1")
              + _tensor("output", "OUTPUT0", "FP32", "1"))
    add_model(repo, "async_sleep", "async_sleep",
              _tensor("input", "INPUT0", "FP32", "1") + _tensor("output", "OUTPUT0", "FP64", "2"))
    add_model(repo, "async_decoupled", "async_decoupled",
              DECOUPLED
              + _tensor("input", "INPUT0", "FP32", "1") + _tensor("output", "OUTPUT0", "FP64", "2"))
    add_model(repo, "bls", "bls",
              _tensor("input", "MODE", "BYTES", "1") + _tensor("input", "INPUT0", "FP32", "-1")
              + _tensor("output", "OUTPUT0", "FP32", "-1")
              + "instance_group [{ count: 2 kind: KIND_CPU }]\n")
    add_model(repo, "bls_async", "bls_async",
              _tensor("input", "INPUT0", "FP32", "-1") + _tensor("output", "OUTPUT0", "FP32", "-1"))
    for name in ("llm", "token_engine"):
        shutil.copytree(EXAMPLES / name, repo / name)
    add_batching_models(repo, record_dir)
    add_sequence_models(repo, record_dir)
    return repo


BATCH_IO = _tensor("input", "INPUT0", "FP32", "1") + _tensor("output", "OUTPUT0", "FP32", "1")

# name -> config (besides inputs and outputs) of the models that record each execute()
BATCHING_MODELS = {
    "batch_off": "max_batch_size: 8\n",
    "batch_nodelay": "max_batch_size: 8\ndynamic_batching {}\n",
    "batch_window": "max_batch_size: 8\n"
                    "dynamic_batching { max_queue_delay_microseconds: 300000 }\n",
    "batch_preferred": "max_batch_size: 8\ndynamic_batching { preferred_batch_size: [ 4 ] "
                       "max_queue_delay_microseconds: 5000000 }\n",
    "queue_priority": "max_batch_size: 1\n"
                      "dynamic_batching { priority_levels: 2 default_priority_level: 2 }\n",
    "queue_reject": "max_batch_size: 1\ndynamic_batching { default_queue_policy { "
                    "timeout_action: REJECT default_timeout_microseconds: 300000 "
                    "allow_timeout_override: true } }\n",
    "queue_delay": "max_batch_size: 1\ndynamic_batching { default_queue_policy { "
                   "timeout_action: DELAY default_timeout_microseconds: 30000000 "
                   "allow_timeout_override: true } }\n",
    "queue_bounded": "max_batch_size: 1\n"
                     "dynamic_batching { default_queue_policy { max_queue_size: 1 } }\n",
    "instance_pool": "instance_group [{ name: \"pool\" count: 2 kind: KIND_CPU }, "
                     "{ count: 1 kind: KIND_CPU }]\n",
    "batch_ordered": "max_batch_size: 1\ndynamic_batching { preserve_ordering: true }\n"
                     "instance_group [{ count: 2 kind: KIND_CPU }]\n",
    "gpu_group": "instance_group [{ count: 1 kind: KIND_GPU gpus: [ 0 ] }]\n",
}
# Inputs of variable size (tests/e2e/test_ragged_batching.py): batched only when their
# shapes agree, unless they allow ragged batches.
VARIABLE_IO = _tensor("output", "OUTPUT0", "FP32", "-1")
SHAPED_MODELS = {
    "batch_shaped": _tensor("input", "INPUT0", "FP32", "-1"),
    "batch_ragged": _tensor("input", "INPUT0", "FP32", "-1", " allow_ragged_batch: true")
    + 'batch_input [{ kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "INDEX" '
      'data_type: TYPE_FP32 source_input: "INPUT0" }]\n',
}


def add_batching_models(repo: Path, record_dir: Path) -> None:
    """Models for the batching and queue-policy tests; each records into <name>.jsonl."""
    for name, config in BATCHING_MODELS.items():
        add_model(repo, name, "batch_record",
                  config + BATCH_IO + _parameter("record_file", f"{record_dir}/{name}.jsonl"))
    for name, inputs in SHAPED_MODELS.items():
        add_model(repo, name, "batch_record",
                  "max_batch_size: 8\ndynamic_batching {}\n" + inputs + VARIABLE_IO
                  + _parameter("record_file", f"{record_dir}/{name}.jsonl"))


SEQUENCE_IO = (_tensor("input", "INPUT0", "INT32", "1")
               + _tensor("input", "DELAY", "FP32", "1", " optional: true")
               + _tensor("output", "SUM", "INT32", "1") + _tensor("output", "SEEN", "BYTES", "1"))
SEQUENCE_CONTROLS = (
    "control_input [\n"
    '  { name: "START" control [{ kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] }] },\n'
    '  { name: "END" control [{ kind: CONTROL_SEQUENCE_END bool_false_true: [false, true] }] },\n'
    '  { name: "READY" control [{ kind: CONTROL_SEQUENCE_READY fp32_false_true: [0, 1] }] },\n'
    '  { name: "CORRID" control [{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }] }\n'
    "]\n"
)


def add_sequence_models(repo: Path, record_dir: Path) -> None:
    """Stateful models (tests/models/accumulator.py); each records into <name>.jsonl."""
    add_model(repo, "sequence_accumulator", "accumulator",
              "sequence_batching {\n  direct {}\n  max_sequence_idle_microseconds: 30000000\n"
              + SEQUENCE_CONTROLS + "}\n"
              + "instance_group [{ count: 2 kind: KIND_CPU }]\n" + SEQUENCE_IO
              + _parameter("record_file", f"{record_dir}/sequence_accumulator.jsonl"))
    # Direct strategy with batch slots (tests/models/slot_sum.py): one instance, 4 slots.
    slots = ("max_batch_size: 4\nsequence_batching {\n  max_sequence_idle_microseconds: "
             "10000000\n" + SEQUENCE_CONTROLS)
    add_model(repo, "sequence_slots", "slot_sum",
              slots + "  direct {}\n}\n" + SEQUENCE_IO
              + _parameter("record_file", f"{record_dir}/sequence_slots.jsonl"))
    add_model(repo, "sequence_slots_delayed", "slot_sum",
              slots + "  direct { max_queue_delay_microseconds: 3000000 "
              "minimum_slot_utilization: 0.5 }\n}\n" + SEQUENCE_IO
              + _parameter("record_file", f"{record_dir}/sequence_slots_delayed.jsonl"))
    # Releases a sequence after 0.3 s without a request; no control inputs.
    add_model(repo, "sequence_idle", "accumulator",
              "sequence_batching { max_sequence_idle_microseconds: 300000 }\n" + SEQUENCE_IO
              + _parameter("record_file", f"{record_dir}/sequence_idle.jsonl"))
    add_fidelity_models(repo, record_dir)


RESCHEDULE_IO = (_tensor("input", "IN", "INT32", "1") + _tensor("output", "OUT", "INT32", "1")
                 + _tensor("output", "SEEN", "BYTES", "1"))
ITERATIVE = ("sequence_batching {\n  iterative_sequence: true\n  control_input [{ name: "
             '"START" control [{ kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] }] }]\n'
             "}\n")
# The state input a sequence's requests carry, initialised from initial_state/seven.bin.
STATE = ('sequence_batching {\n  state [{ input_name: "IN_STATE" output_name: "OUT_STATE" '
         "data_type: TYPE_INT32 dims: [1]\n    initial_state { data_type: TYPE_INT32 dims: [1] "
         'data_file: "seven.bin" name: "seven" } }]\n}\n')


def add_fidelity_models(repo: Path, record_dir: Path) -> None:
    """Iterative sequences and rescheduling (tests/models/reschedule.py), implicit state."""
    add_model(repo, "reschedule_iterative", "reschedule", ITERATIVE + RESCHEDULE_IO)
    add_model(repo, "reschedule_iterative_decoupled", "reschedule",
              ITERATIVE + DECOUPLED + RESCHEDULE_IO)
    add_model(repo, "reschedule_returns_response", "reschedule",
              ITERATIVE + RESCHEDULE_IO + _parameter("misuse", "return_response"))
    add_model(repo, "reschedule_not_iterative", "reschedule", RESCHEDULE_IO)
    add_model(repo, "bls_reschedule", "bls_reschedule", RESCHEDULE_IO)
    add_model(repo, "reschedule_not_iterative_decoupled", "reschedule",
              DECOUPLED + RESCHEDULE_IO)
    state_dir = add_model(repo, "sequence_state", "accumulator", STATE + SEQUENCE_IO
                          + _parameter("record_file", f"{record_dir}/sequence_state.jsonl"))
    # Batches the requests of up to 4 sequences (tests/models/batch_record.py records each).
    add_model(repo, "sequence_oldest", "batch_record",
              "max_batch_size: 8\nsequence_batching {\n  oldest { max_candidate_sequences: 8 "
              "preferred_batch_size: [4] max_queue_delay_microseconds: 5000000 }\n"
              '  control_input [{ name: "CORRID" control [{ kind: CONTROL_SEQUENCE_CORRID '
              "data_type: TYPE_UINT64 }] }]\n}\n" + BATCH_IO
              + _parameter("record_file", f"{record_dir}/sequence_oldest.jsonl"))
    # One candidate sequence: a second one waits in the backlog until the first ends.
    add_model(repo, "sequence_oldest_one", "batch_record",
              "max_batch_size: 8\nsequence_batching {\n  oldest { max_candidate_sequences: 1 }\n"
              "  max_sequence_idle_microseconds: 60000000\n}\n" + BATCH_IO
              + _parameter("record_file", f"{record_dir}/sequence_oldest_one.jsonl"))
    (state_dir / "initial_state").mkdir(exist_ok=True)
    (state_dir / "initial_state" / "seven.bin").write_bytes((7).to_bytes(4, "little"))


def lifecycle_config(record_file: Path, generation: int = 1, decoupled: bool = False,
                     instances: int = 1) -> str:
    """config.pbtxt of a ``lifecycle`` model (tests/models/lifecycle.py)."""
    return ((DECOUPLED if decoupled else "")
            + _tensor("input", "INPUT0", "FP32", "1") + _tensor("output", "OUTPUT0", "FP32", "3")
            + f"instance_group [{{ count: {instances} kind: KIND_CPU }}]\n"
            + _parameter("record_file", str(record_file))
            + _parameter("generation", str(generation)))


def add_lifecycle_model(repo: Path, name: str, record_file: Path, generation: int = 1,
                        decoupled: bool = False, instances: int = 1) -> Path:
    """A model that records initialize/finalize and each request's start/done/cancelled."""
    return add_model(repo, name, "lifecycle",
                     lifecycle_config(record_file, generation, decoupled, instances))
