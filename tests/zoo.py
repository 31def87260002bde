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
    add_model(repo, "slow_child", "slow",
              _tensor("input", "INPUT0", "FP32", "1") + _tensor("output", "OUTPUT0", "FP32", "1")
              + _parameter("record_file", f"{record_dir}/slow_child.jsonl"))
    add_model(repo, "repeat", "repeat",
              DECOUPLED
              + _tensor("input", "INPUT0", "INT32", "1")
              + _tensor("input", "DELAY", "FP32", "1", " optional: true")
              + _tensor("output", "OUTPUT0", "INT32", "1"))
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
    return repo
