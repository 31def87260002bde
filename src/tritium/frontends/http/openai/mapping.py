"""OpenAI requests onto a model's inputs, and its responses back to text, by the generate
convention of Triton's LLM models: ``text_input`` in, ``text_output`` out, and ``max_tokens``,
``stream`` and sampling fields passed only to a model that declares them."""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from tritium.core.model import ModelHandle
from tritium.core.request import InferenceRequest
from tritium.core.response import InferenceResponse
from tritium.core.types import DataType, Tensor, TensorSpec
from tritium.frontends.http.generate import generate_shape
from tritium.frontends.http.openai.errors import OpenAIError, bad_param
from tritium.frontends.http.openai.params import Params

TEXT_INPUT = "text_input"
TEXT_OUTPUT = "text_output"
# Token counts a model may answer with (as Triton's vLLM backend does), for ``usage``.
INPUT_TOKENS = "num_input_tokens"
OUTPUT_TOKENS = "num_output_tokens"
# OpenAI field -> the model inputs that may take it, first declared wins (TensorRT-LLM's
# models call their stop list ``stop_words``).
_INPUT_NAMES: dict[str, tuple[str, ...]] = {"stop": ("stop", "stop_words")}


def check_text_model(model: ModelHandle) -> None:
    for name, table in ((TEXT_INPUT, model.inputs), (TEXT_OUTPUT, model.outputs)):
        spec = table.get(name)
        if spec is None or spec.datatype is not DataType.BYTES:
            raise OpenAIError(
                400, f"model '{model.name}' has no BYTES '{name}' tensor: OpenAI requests "
                     f"need a model with '{TEXT_INPUT}' and '{TEXT_OUTPUT}'", param="model")


def build_request(model: ModelHandle, prompt: str, params: Params, request_id: str
                  ) -> InferenceRequest:
    """The inference request for ``prompt``: every field the model declares, in the
    datatype and shape it declares; fields it does not declare are left out."""
    check_text_model(model)
    fields: dict[str, list[Any]] = {TEXT_INPUT: [prompt], "stream": [params.stream]}
    if params.max_tokens is not None:
        fields["max_tokens"] = [params.max_tokens]
    for name, value in params.sampling.items():
        fields[name] = value if type(value) is list else [value]
    inputs: dict[str, Tensor] = {}
    for field_name, values in fields.items():
        spec = _declared(model, field_name)
        if spec is not None:
            inputs[spec.name] = _tensor(spec, model.max_batch_size > 0, field_name, values)
    return InferenceRequest(model_name=model.name, inputs=inputs, model_version=model.version,
                            id=request_id)


def _declared(model: ModelHandle, field_name: str) -> TensorSpec | None:
    for name in _INPUT_NAMES.get(field_name, (field_name,)):
        spec = model.inputs.get(name)
        if spec is not None:
            return spec
    return None


def _tensor(spec: TensorSpec, batched: bool, field_name: str, values: list[Any]) -> Tensor:
    dims = ((-1,) if batched else ()) + spec.dims
    shape = generate_shape(dims, len(values))
    if shape is None:
        raise bad_param(field_name, f"the model's input '{spec.name}' (dims {list(spec.dims)}) "
                                    f"cannot hold {len(values)} value(s)")
    try:
        data = _array(spec.datatype, values)
    except (OverflowError, ValueError, TypeError):
        raise bad_param(field_name, f"{values!r} does not fit the model's input "
                                    f"'{spec.name}' of type {spec.datatype.wire}") from None
    return Tensor(spec.name, spec.datatype, shape, data.reshape(shape))


def _array(datatype: DataType, values: list[Any]) -> np.ndarray:
    if datatype is DataType.BYTES:
        return np.array([str(v).encode() for v in values], dtype=np.object_)
    if datatype is DataType.BOOL:
        return np.array([bool(v) for v in values], dtype=np.bool_)
    if datatype is DataType.BF16:  # held as the raw 16-bit patterns
        return np.array(values, dtype=ml_dtypes.bfloat16).view(np.uint16)
    data = np.array(values, dtype=datatype.numpy)
    # A value the type cannot hold would be changed silently (a float into an integer
    # type, a negative into an unsigned one): refuse it instead.
    if np.issubdtype(data.dtype, np.integer) and data.tolist() != values:
        raise ValueError("changed by the conversion")
    return data


class TextDecoder:
    """The text of a model's responses, UTF-8 decoded across response boundaries: a token
    may end in the middle of a character."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def text(self, response: InferenceResponse) -> str:
        for tensor in response.outputs:
            if tensor.name == TEXT_OUTPUT:
                return self._decoder.decode(b"".join(_as_bytes(v) for v in
                                                     tensor.data.reshape(-1).tolist()))
        return ""

    def rest(self) -> str:
        return self._decoder.decode(b"", final=True)


def _as_bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


@dataclass(slots=True)
class Usage:
    """Token counts, known when the model reports them (the prompt's once, the
    completion's summed over responses) or a tokenizer counted them."""

    prompt_tokens: int | None = None
    completion_tokens: int = 0
    reported: bool = False
    # The model's own counts: only they tell that it stopped at max_tokens (a tokenizer's
    # count of the text need not match the model's steps).
    by_model: bool = False

    def add(self, response: InferenceResponse) -> None:
        counts = {t.name: int(t.data.reshape(-1)[0]) for t in response.outputs
                  if t.name in (INPUT_TOKENS, OUTPUT_TOKENS) and t.element_count}
        if OUTPUT_TOKENS in counts:
            self.reported = self.by_model = True
            self.completion_tokens += counts[OUTPUT_TOKENS]
        if INPUT_TOKENS in counts and self.prompt_tokens is None:
            self.prompt_tokens = counts[INPUT_TOKENS]

    def counted(self, prompt_tokens: int, completion_tokens: int) -> None:
        """Counts from a tokenizer, for a model that reports none."""
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.reported = True

    def object(self) -> dict[str, int] | None:
        if not self.reported or self.prompt_tokens is None:
            return None
        return {"prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}

    def finish_reason(self, max_tokens: int | None) -> str:
        """"length" when the model reported it stopped at the limit, else "stop"."""
        if self.by_model and max_tokens is not None and self.completion_tokens >= max_tokens:
            return "length"
        return "stop"
