"""Top-N classification in the core, and the class labels a model loads for it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tritium.core.classification import classify
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.serialization import bytes_elements
from tritium.core.types import DataType, Tensor
from tritium.repository.config import ConfigError, load_model_config
from tritium.repository.loaded import LoadedModel

SCORES = np.array([[0.1, 0.7, 0.2], [0.5, 0.25, 0.75]], dtype=np.float32)


def classes(tensor: Tensor) -> list[str]:
    return [element.decode() for element in bytes_elements(tensor.data)]


# ------------------------------------------------------------------------ classify


def test_batched_top_n_with_labels() -> None:
    result = classify(Tensor("P", DataType.FP32, (2, 3), SCORES), 2, True, {"P": ["cat", "dog"]})
    assert (result.name, result.datatype, result.shape) == ("P", DataType.BYTES, (2, 2))
    assert result.data.shape == (2, 2)
    # Index 2 has no label: the file was shorter than the class count.
    assert classes(result) == ["0.700000:1:dog", "0.200000:2", "0.750000:2", "0.500000:0:cat"]


def test_unbatched_tensor_is_one_row_over_every_element() -> None:
    result = classify(Tensor("P", DataType.FP32, (2, 3), SCORES), 3, False, None)
    assert result.shape == (3,)
    assert classes(result) == ["0.750000:5", "0.700000:1", "0.500000:3"]


def test_integers_print_as_integers_and_count_is_capped() -> None:
    values = np.array([3, 9, 1], dtype=np.int64)
    result = classify(Tensor("I", DataType.INT64, (3,), values), 10, False, {"other": ["x"]})
    assert classes(result) == ["9:1", "3:0", "1:2"]


def test_ties_keep_the_lower_index_first() -> None:
    values = np.array([[1, 2, 2, 1]], dtype=np.uint8)
    result = classify(Tensor("U", DataType.UINT8, (1, 4), values), 4, True, None)
    assert classes(result) == ["2:1", "2:2", "1:0", "1:3"]


def test_empty_batch() -> None:
    empty = np.zeros((0, 3), dtype=np.float32)
    result = classify(Tensor("P", DataType.FP32, (0, 3), empty), 2, True, None)
    assert result.shape == (0, 2) and result.data.size == 0


@pytest.mark.parametrize("datatype", [DataType.BYTES, DataType.BOOL, DataType.FP16,
                                      DataType.BF16], ids=lambda t: t.wire)
def test_unsupported_types_are_refused(datatype: DataType) -> None:
    data = np.zeros(2, dtype=datatype.numpy)
    with pytest.raises(TritiumError, match="class result not available") as info:
        classify(Tensor("X", datatype, (2,), data), 1, False, None)
    assert info.value.code is ErrorCode.INVALID_ARG


# ------------------------------------------------------------------ label files

CONFIG = """backend: "python"
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [3] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [3] %s },
        { name: "OUTPUT1" data_type: TYPE_FP32 dims: [3] }]
"""


def model_dir(tmp_path: Path, label_filename: str) -> Path:
    directory = tmp_path / "m"
    (directory / "1").mkdir(parents=True)
    (directory / "1" / "model.py").write_text("")
    extra = f'label_filename: "{label_filename}"' if label_filename else ""
    (directory / "config.pbtxt").write_text(CONFIG % extra)
    return directory


def loaded(directory: Path) -> LoadedModel:
    return LoadedModel(directory, 1, load_model_config(directory, None))


def test_labels_are_read_one_per_line(tmp_path: Path) -> None:
    directory = model_dir(tmp_path, "labels.txt")
    (directory / "labels.txt").write_bytes("cat\r\ndog\n\nemu é\n".encode())
    assert loaded(directory).labels == {"OUTPUT0": ["cat", "dog", "", "emu é"]}


def test_no_label_file_no_labels(tmp_path: Path) -> None:
    assert loaded(model_dir(tmp_path, "")).labels == {}


def test_missing_label_file_fails_the_load(tmp_path: Path) -> None:
    directory = model_dir(tmp_path, "labels.txt")
    with pytest.raises(ConfigError, match=r"label file 'labels\.txt' of output 'OUTPUT0'") as info:
        loaded(directory)
    assert info.value.code is ErrorCode.INVALID_ARG


def test_label_file_must_be_utf8(tmp_path: Path) -> None:
    directory = model_dir(tmp_path, "labels.txt")
    (directory / "labels.txt").write_bytes(b"\xff\n")
    with pytest.raises(ConfigError, match="not valid UTF-8"):
        loaded(directory)


@pytest.mark.parametrize("name", ["/etc/hostname", "../labels.txt", "a/../../labels.txt"])
def test_label_file_must_stay_in_the_model_directory(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError, match="relative path inside the model directory"):
        load_model_config(model_dir(tmp_path, name), None)
