"""Model warmup: the ``model_warmup`` samples of a config, run on every instance before
the model is READY, as Triton runs them.

Each sample is ``batch_size`` requests of batch 1 handed to an instance in one
``execute``, ``count`` times (0 means once). A response carrying an error fails the load
with Triton's text: "failed to run warmup sample '<name>': <error>; ". Warmup requests
reach the instance directly, not through the scheduler, so the model's statistics do
not count them.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from tritonclient.grpc import model_config_pb2 as pb

from tritium.core.cancellation import Cancellation
from tritium.core.errors import ErrorCode, TritiumError
from tritium.core.request import AdmittedRequest, InferenceRequest, RequestStage
from tritium.core.response import ResponseStream, wake_all
from tritium.core.serialization import bytes_from_binary
from tritium.core.types import DataType, Tensor

log = logging.getLogger("tritium.repository")

WARMUP_FOLDER = "warmup"  # where input_data_file names are looked up, in the model dir


class WarmupInstance(Protocol):
    name: str

    def submit(self, batch: list[AdmittedRequest]) -> None: ...


@dataclass(frozen=True, slots=True)
class WarmupSample:
    """One ``model_warmup`` entry, its tensors made: the inputs of one request."""

    name: str
    batch_size: int
    count: int
    inputs: dict[str, Tensor]


def _error(message: str) -> TritiumError:
    return TritiumError(ErrorCode.INVALID_ARG, message)


def warmup_samples(config: Any, model_dir: Path) -> list[WarmupSample]:
    """The config's warmup samples, data made or read; entries of batch size 0 are skipped
    as Triton skips them. Raises TritiumError for a sample Triton refuses."""
    samples = []
    batched = config.max_batch_size > 0
    for setting in config.model_warmup:
        if setting.batch_size == 0:
            continue
        inputs = {name: _input(name, meta, model_dir, batched)
                  for name, meta in sorted(setting.inputs.items())}
        samples.append(WarmupSample(setting.name, setting.batch_size, max(setting.count, 1),
                                    inputs))
    return samples


def _input(name: str, meta: Any, model_dir: Path, batched: bool) -> Tensor:
    dims = tuple(meta.dims)
    if any(d < 0 for d in dims):
        raise _error("warmup setting expects all variable-size dimensions are specified "
                     f"for input '{name}'")
    datatype = DataType.from_config(pb.DataType.Name(meta.data_type))
    if datatype is None:
        raise _error(f"warmup setting for input '{name}' has no valid data_type")
    count = math.prod(dims)
    kind = meta.WhichOneof("input_data_type")
    if kind == "input_data_file":
        data = _from_file(name, meta.input_data_file, model_dir, datatype, count)
    elif kind == "random_data" and datatype is not DataType.BYTES:
        data = _random(datatype, count)
    elif kind in ("zero_data", "random_data"):
        # Triton warms strings with zeros for random data too: empty strings.
        data = (np.full(count, b"", dtype=object) if datatype is DataType.BYTES
                else np.zeros(count, dtype=datatype.numpy))
    else:
        raise _error(f"warmup setting expects input '{name}' to have input_data_type set")
    shape = ((1,) if batched else ()) + dims
    return Tensor(name, datatype, shape, data.reshape(shape))


def _random(datatype: DataType, count: int) -> np.ndarray:
    raw = np.random.default_rng().integers(0, 256, count * datatype.itemsize, dtype=np.uint8)
    if datatype is DataType.BOOL:
        return (raw % 2).astype(np.bool_)
    return raw.view(datatype.numpy)


def _from_file(name: str, file_name: str, model_dir: Path, datatype: DataType,
               count: int) -> np.ndarray:
    folder = (model_dir / WARMUP_FOLDER).resolve()
    path = (folder / file_name).resolve()
    if not path.is_relative_to(folder):
        raise _error(f"warmup data file '{file_name}' of input '{name}' is outside the "
                     f"model's '{WARMUP_FOLDER}' folder")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise _error(f"failed to read warmup data file '{file_name}' for input '{name}': "
                     f"{exc.strerror or exc}") from None
    if datatype is DataType.BYTES:
        return bytes_from_binary(raw, count, f"for warmup input '{name}'")
    needed = count * datatype.itemsize
    if len(raw) < needed:
        # Triton's words, its missing space included.
        raise _error(f"warmup setting expects {needed} bytes, but the data provided from "
                     f"{file_name}only has {len(raw)} bytes")
    return np.frombuffer(raw[:needed], dtype=datatype.numpy).copy()


class WarmupRoute:
    """Where instances report a finished ``execute``: to the warmup while it runs, then
    to the scheduler. Only models with warmup samples pay for this hop."""

    def __init__(self) -> None:
        self.target: Callable[..., None] = self._warming
        self._waiters: dict[int, asyncio.Future[None]] = {}

    def __call__(self, instance: Any, batch: list[AdmittedRequest], exec_ns: int,
                 woken: list[ResponseStream] | None = None) -> None:
        self.target(instance, batch, exec_ns, woken)

    def _warming(self, instance: Any, batch: list[AdmittedRequest], exec_ns: int,
                 woken: list[ResponseStream] | None = None) -> None:
        if woken:
            wake_all(woken)
        waiter = self._waiters.pop(id(batch), None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def run(self, instance: WarmupInstance, batch: list[AdmittedRequest]) -> None:
        """Hand ``batch`` to ``instance`` and wait until its ``execute`` returned."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters[id(batch)] = waiter
        instance.submit(batch)
        await waiter


async def warm_up(model_name: str, samples: Sequence[WarmupSample],
                  instances: Sequence[WarmupInstance], route: WarmupRoute) -> None:
    """Run every sample on every instance (instances in parallel, samples in order)."""
    await asyncio.gather(*(_warm_instance(model_name, samples, instance, route)
                           for instance in instances))


async def _warm_instance(model_name: str, samples: Sequence[WarmupSample],
                         instance: WarmupInstance, route: WarmupRoute) -> None:
    loop = asyncio.get_running_loop()
    for sample in samples:
        for iteration in range(1, sample.count + 1):
            log.debug("model '%s' instance %s is running warmup sample '%s' for iteration %d",
                     model_name, instance.name, sample.name, iteration)
            batch = [_request(model_name, sample, loop) for _ in range(sample.batch_size)]
            await route.run(instance, batch)
            errors = [message for request in batch for message in await _errors(request)]
            if errors:
                raise TritiumError(
                    ErrorCode.INVALID_ARG,
                    f"failed to run warmup sample '{sample.name}': "
                    + "".join(f"{message}; " for message in errors))


def _request(model_name: str, sample: WarmupSample, loop: asyncio.AbstractEventLoop
             ) -> AdmittedRequest:
    request = InferenceRequest(model_name, dict(sample.inputs))
    admitted = AdmittedRequest(request, Cancellation(loop), ResponseStream(loop))
    admitted.move_to(RequestStage.QUEUED)
    admitted.move_to(RequestStage.EXECUTING)
    return admitted


async def _errors(request: AdmittedRequest) -> list[str]:
    """The error messages of every response ``request`` got, once its final one came."""
    messages = []
    async for response in request.stream:
        if response.error is not None:
            messages.append(response.error.message)
    return messages
