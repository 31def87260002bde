"""pb_utils.ModelConfig: the dict a model's auto_complete_config reads and edits."""

from __future__ import annotations

import json
from typing import Any

from tritium.core.errors import ErrorCode, TritiumError

# protobuf and the repository's config module are imported where a protobuf is handled:
# an instance process gets the JSON form and never needs them (about 3 MiB).

_INPUT_KEYS = ("name", "data_type", "dims", "optional")
_OUTPUT_KEYS = ("name", "data_type", "dims")


class ModelConfig:
    """Triton's JSON form of a model configuration, as a dict the model may change.

    Accepts the JSON text (what Triton's stub passes), a dict, or a ModelConfig
    protobuf. ``as_dict()`` returns the live dict, so edits to it count too.
    """

    def __init__(self, model_config: Any) -> None:
        if isinstance(model_config, str):
            self._model_config: dict[str, Any] = json.loads(model_config)
        elif isinstance(model_config, dict):
            self._model_config = model_config
        else:
            from tritium.repository.config import config_to_json

            self._model_config = config_to_json(model_config)

    def as_dict(self) -> dict[str, Any]:
        return self._model_config

    def to_protobuf(self) -> Any:
        """The configuration as tritonclient's ModelConfig; INVALID_ARG if it is not one."""
        from google.protobuf import json_format

        from tritium.core.config_pb import model_config_pb2

        try:
            return json_format.ParseDict(self._model_config, model_config_pb2.ModelConfig())
        except json_format.ParseError as exc:
            raise TritiumError(
                ErrorCode.INVALID_ARG,
                f"auto-completed configuration of model '{self._name}' is invalid: {exc}",
            ) from exc

    def set_max_batch_size(self, max_batch_size: int) -> None:
        current = self._model_config.get("max_batch_size", 0)
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in "
                f"auto-complete-config function for model '{self._name}' specified "
                f"max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for scheduler in ("sequence_batching", "ensemble_scheduling"):
            if scheduler in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{scheduler}', but "
                    f"auto-complete-config function for model '{self._name}' tries to set "
                    "scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:
        self._add_tensor("input", input, _INPUT_KEYS)

    def add_output(self, output: dict[str, Any]) -> None:
        self._add_tensor("output", output, _OUTPUT_KEYS)

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    "model transaction property in auto-complete-config function for model "
                    f"'{self._name}' contains property other than 'decoupled'."
                )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" not in transaction_policy_dict:
            return
        wanted = transaction_policy_dict["decoupled"]
        if "decoupled" in policy and policy["decoupled"] != wanted:
            raise ValueError(
                "trying to change decoupled property in auto-complete-config for model "
                f"'{self._name}', which is already set to '{policy['decoupled']}'."
            )
        policy["decoupled"] = wanted

    @property
    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def _add_tensor(self, kind: str, tensor: dict[str, Any], allowed: tuple[str, ...]) -> None:
        _check_tensor_keys(kind, tensor, allowed, self._name)
        existing = self._model_config.setdefault(kind, [])
        for current in existing:
            if current.get("name") == tensor["name"]:
                _merge_tensor(kind, current, tensor, self._name)
                return
        existing.append(tensor)


def _check_tensor_keys(kind: str, tensor: Any, allowed: tuple[str, ...], model: str) -> None:
    if not isinstance(tensor, dict):
        raise ValueError(
            f"{kind} in auto-complete-config function for model '{model}' is not a dict"
        )
    where = f"in auto-complete-config function for model '{model}'"
    label = f"{kind} '{tensor.get('name', '')}' {where}"
    for key in tensor:
        if key not in allowed:
            names = ", ".join(f"'{name}'" for name in allowed[:-1])
            raise ValueError(f"{label} contains property other than {names} and '{allowed[-1]}'.")
    if "name" not in tensor:
        raise ValueError(f"{kind} {where} is missing 'name' property.")
    for key in ("data_type", "dims"):
        if key not in tensor:
            raise ValueError(f"{label} is missing '{key}' property.")


def _merge_tensor(kind: str, current: dict[str, Any], tensor: dict[str, Any], model: str) -> None:
    """Fill in a tensor the configuration already names; it may not contradict it."""
    name = tensor["name"]
    known_type = current.get("data_type", "TYPE_INVALID")
    if known_type != "TYPE_INVALID" and known_type != tensor["data_type"]:
        raise ValueError(
            f"unable to load model '{model}', configuration expects datatype {known_type} "
            f"for {kind} '{name}', model provides {tensor['data_type']}"
        )
    if current.get("dims") and list(current["dims"]) != list(tensor["dims"]):
        raise ValueError(
            f"model '{model}', tensor '{name}': the model expects dims {tensor['dims']} but "
            f"the model configuration specifies dims {current['dims']}"
        )
    if "optional" in current and "optional" in tensor and current["optional"] != tensor["optional"]:
        raise ValueError(
            f"model '{model}', tensor '{name}': the model expects optional {tensor['optional']} "
            f"but the model configuration specifies optional {current['optional']}"
        )
    current["data_type"] = tensor["data_type"]
    current["dims"] = tensor["dims"]
    if "optional" in tensor:
        current["optional"] = tensor["optional"]
