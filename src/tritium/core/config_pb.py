"""tritonclient's generated ``ModelConfig`` messages, without the rest of
``tritonclient.grpc``: that package's ``__init__`` imports grpc (about 30 MiB of an instance
process's memory), and a model's configuration needs only protobuf.

The module is the same object under its own name either way: a later ``import
tritonclient.grpc`` finds it in ``sys.modules`` instead of defining the messages twice.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType

_NAME = "tritonclient.grpc.model_config_pb2"


def _load() -> ModuleType:
    loaded = sys.modules.get(_NAME)
    if loaded is not None:
        return loaded
    spec = importlib.util.find_spec("tritonclient")
    assert spec is not None and spec.submodule_search_locations
    package = next(iter(spec.submodule_search_locations))
    path = os.path.join(package, "grpc", "model_config_pb2.py")
    module_spec = importlib.util.spec_from_file_location(_NAME, path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[_NAME] = module
    module_spec.loader.exec_module(module)
    return module


model_config_pb2 = _load()
