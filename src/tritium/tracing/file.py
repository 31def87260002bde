"""Triton's trace mode: the JSON trace file ``--trace-config triton,file=...`` names.

Its shape is Triton's: one JSON array of records, for each request to a model first
``{"id", "model_name", "model_version"[, "request_id"][, "parent_id"]}``, then one
``{"id", "timestamps": [{"name", "ns"}]}`` per activity (steady-clock nanoseconds). A trace
tree is written once all of it has ended. With ``log-frequency`` N > 0 every N trees go to
``<file>.<index>`` (each a complete array), as Triton does; with 0, all go to the file.
Level TENSORS adds Triton's ``{"id", "activity", "tensor": {"name", "data", "shape",
"dtype"}}`` records (TENSOR_QUEUE_INPUT, TENSOR_BACKEND_OUTPUT). Cancellations add
timestamp records and one ``{"id", "cancel": {...}}`` record.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import orjson

from tritium.core.types import Tensor
from tritium.tracing.trace import ModelTrace, RootTrace

log = logging.getLogger("tritium.tracing")


class TraceFile:
    """The file, or the indexed files, trace trees are written to (thread-safe)."""

    def __init__(self, path: str, log_frequency: int):
        self.path = path
        self.log_frequency = log_frequency
        self._lock = threading.Lock()
        self._handle: Any = None  # the open file when log_frequency is 0
        self._pending: list[bytes] = []  # trees waiting for the next indexed file
        self._index = 0

    def write(self, tree: bytes) -> None:
        with self._lock:
            try:
                if self.log_frequency:
                    self._pending.append(tree)
                    if len(self._pending) >= self.log_frequency:
                        self._write_indexed()
                else:
                    self._append(tree)
            except OSError as exc:
                log.error("failed writing trace file %s: %s", self.path, exc)

    def close(self) -> None:
        with self._lock:
            try:
                if self._pending:
                    self._write_indexed()
                if self._handle is not None:
                    self._handle.write(b"]")
                    self._handle.close()
                    self._handle = None
            except OSError as exc:
                log.error("failed writing trace file %s: %s", self.path, exc)

    def _append(self, tree: bytes) -> None:
        if self._handle is None:
            self._handle = Path(self.path).open("wb")  # noqa: SIM115 (open until close)
            self._handle.write(b"[")
        else:
            self._handle.write(b",")
        self._handle.write(tree)
        self._handle.flush()

    def _write_indexed(self) -> None:
        target = Path(f"{self.path}.{self._index}")
        self._index += 1
        trees, self._pending = self._pending, []
        target.write_bytes(b"[" + b",".join(trees) + b"]")


class FileSink:
    """Records a tree as Triton's records, into the root's list, then writes it whole."""

    def __init__(self, trace_file: TraceFile):
        self.file = trace_file

    def start_root(self, root: RootTrace, ns: int) -> int:
        return root.id

    def start_model(self, trace: ModelTrace, parent: Any, ns: int) -> int:
        header: dict[str, Any] = {"id": trace.id, "model_name": trace.model_name,
                                  "model_version": trace.model_version}
        if trace.request_id:
            header["request_id"] = trace.request_id
        if trace.parent_id:
            header["parent_id"] = trace.parent_id
        trace.root.records.append(header)
        return trace.id

    def start_compute(self, trace: ModelTrace, ns: int) -> int:
        return trace.id

    def event(self, trace: ModelTrace | RootTrace, span: Any, name: str, ns: int,
              attributes: dict[str, Any] | None = None) -> None:
        records = trace.records if isinstance(trace, RootTrace) else trace.root.records
        records.append({"id": span, "timestamps": [{"name": name, "ns": ns}]})
        if attributes:
            records.append({"id": span, "cancel": _plain(attributes)})

    def end(self, span: Any, ns: int, error: str | None = None) -> None:
        pass

    def finished(self, root: RootTrace) -> None:
        # One list append per record from any thread; the tree is complete by now.
        tree = b",".join(orjson.dumps(record) for record in root.records)
        self.file.write(tree)

    def context(self, span: Any) -> str | None:
        return None

    def tensor(self, trace: ModelTrace, activity: str, tensor: Tensor) -> None:
        trace.root.records.append({"id": trace.id, "activity": activity, "tensor": {
            "name": tensor.name, "data": _data(tensor),
            "shape": ",".join(map(str, tensor.shape)), "dtype": tensor.datatype.wire}})

    def close(self) -> None:
        self.file.close()


def _data(tensor: Tensor) -> str:
    """The elements as Triton writes them: comma-separated, BYTES each in quotes."""
    values = tensor.data.reshape(-1)
    if tensor.datatype.wire == "BYTES":
        return ",".join('"' + bytes(v).decode("utf-8", "replace") + '"' for v in values)
    if tensor.datatype.wire == "BOOL":
        return ",".join("1" if v else "0" for v in values)
    return ",".join(str(v) for v in values.tolist())


def _plain(attributes: dict[str, Any]) -> dict[str, Any]:
    """``tritium.cancel.reason`` -> ``reason``: the record is already about the cancel."""
    return {key.rsplit(".", 1)[-1]: value for key, value in attributes.items()}
