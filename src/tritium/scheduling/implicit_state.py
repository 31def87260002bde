"""Implicit sequence state (``sequence_batching.state``) as a python model gets it in Triton.

Triton's sequence batcher adds each state's input (``input_name``) to every request of a
sequence, set up afresh at the sequence's START: ``initial_state`` data (zeros or the bytes
of ``<model dir>/initial_state/<data_file>``), or, without one, a tensor whose variable
dimensions are 1. A backend makes the model's output state the next request's input state
only through TRITONBACKEND_StateNew/StateUpdate, which Triton's python backend never calls,
so a python model sees that initial state on every request of the sequence; the output
named ``output_name`` is an ordinary output.

The checks and their texts are those of Triton's ``GenerateInitialStateData``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tritium.core.errors import invalid
from tritium.core.serialization import bytes_from_binary
from tritium.core.types import DataType, Tensor

INITIAL_STATE_FOLDER = "initial_state"


@dataclass(frozen=True, slots=True)
class ImplicitState:
    """One state: the input tensor its sequence's requests carry."""

    input_name: str
    output_name: str
    datatype: DataType
    shape: tuple[int, ...]
    initial: np.ndarray  # shaped ``shape``, read-only: shared by every request

    def tensor(self) -> Tensor:
        """A request's own copy: model code may write to its inputs, as in Triton."""
        return Tensor(self.input_name, self.datatype, self.shape, self.initial.copy())


def implicit_states(message: Any, max_batch_size: int,
                    model_dir: Path | None) -> tuple[ImplicitState, ...]:
    """The ``state`` entries of ``ModelSequenceBatching`` ``message``."""
    states: list[ImplicitState] = []
    for state in message.state:
        if len(state.initial_state) > 1:
            raise invalid(f"initial_state field for state input '{state.input_name}' must "
                          "contain exactly one or zero element. Found "
                          f"'{len(state.initial_state)}' elements.")
        if any(s.input_name == state.input_name for s in states):
            raise invalid(f"State input name '{state.input_name}' specified more than once.")
        states.append(_state(state, max_batch_size, model_dir))
    return tuple(states)


def _state(state: Any, max_batch_size: int, model_dir: Path | None) -> ImplicitState:
    datatype = DataType.from_code(state.data_type)
    if datatype is None:
        raise invalid(f"state input '{state.input_name}' has an unsupported data type")
    batch = (1,) if max_batch_size > 0 else ()
    if not state.initial_state:
        # Triton's first request carries uninitialised memory (empty strings for BYTES);
        # zeros are one such content.
        shape = batch + tuple(1 if dim == -1 else dim for dim in state.dims)
        return ImplicitState(state.input_name, state.output_name, datatype, shape,
                             _frozen(zeros(datatype, shape)))
    initial = state.initial_state[0]
    shape = batch + _initial_dims(initial, state)
    return ImplicitState(state.input_name, state.output_name, datatype, shape,
                         _frozen(_initial_data(initial, state, datatype, shape, model_dir)))


def _initial_dims(initial: Any, state: Any) -> tuple[int, ...]:
    name = state.input_name
    if initial.data_type != state.data_type:
        raise invalid(f"The data type used for 'initial_state' field of state '{name}' does "
                      "not match the state data type.")
    if not initial.name:
        raise invalid("Field 'name' must be set when using initial_state for state input "
                      f"'{name}'.")
    if len(initial.dims) != len(state.dims):
        raise invalid("Number of dimensions in 'initial_state' doesn't match the size of "
                      f"'state' dimensions for state input '{name}'. {len(initial.dims)} "
                      f"!= {len(state.dims)}")
    for dim, state_dim in zip(initial.dims, state.dims, strict=True):
        if dim == -1:
            raise invalid(f"'initial_state' field for state input name '{name}' contains "
                          "variable dimensions.")
        if state_dim != -1 and dim != state_dim:
            raise invalid(f"'initial_state' dim for input name '{name}' doesn't match "
                          f"'state' dim description. {dim} != {state_dim}")
    return tuple(initial.dims)


def _initial_data(initial: Any, state: Any, datatype: DataType, shape: tuple[int, ...],
                  model_dir: Path | None) -> np.ndarray:
    which = initial.WhichOneof("state_data")
    if which == "zero_data":
        return zeros(datatype, shape)
    if which != "data_file":
        raise invalid(f"initial_state setting expects state'{state.input_name}' to have "
                      "state_data set")
    if model_dir is None:
        raise invalid(f"initial_state data_file of state '{state.input_name}' needs the "
                      "model directory")
    path = model_dir / INITIAL_STATE_FOLDER / initial.data_file
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise invalid(f"failed to open text file for read {path}: "
                      f"{exc.strerror or exc}") from None
    count = int(np.prod(shape, dtype=np.int64))
    if datatype is DataType.BYTES:
        return bytes_from_binary(data, count, f"for initial state '{state.input_name}'"
                                 ).reshape(shape)
    needed = count * datatype.itemsize
    if needed > len(data):
        # Triton's text, without a space before "only".
        raise invalid(f"initial_state setting expects {needed} bytes, but the data provided "
                      f"from {initial.data_file}only has {len(data)} bytes.")
    return np.frombuffer(data[:needed], dtype=datatype.numpy).reshape(shape)


def zeros(datatype: DataType, shape: tuple[int, ...]) -> np.ndarray:
    """Zeros of ``datatype`` (empty strings for BYTES)."""
    if datatype is DataType.BYTES:
        return np.full(shape, b"", dtype=np.object_)
    return np.zeros(shape, dtype=datatype.numpy)


def _frozen(array: np.ndarray) -> np.ndarray:
    array = np.array(array)  # own copy: never a view of the file's bytes
    array.setflags(write=False)
    return array
