"""The python backend: pb_utils, model.py loading, BLS."""

from tritium.backends.python.backend import PythonBackend
from tritium.backends.python.loader import auto_complete_config, create_python_backend

__all__ = ["PythonBackend", "auto_complete_config", "create_python_backend"]
