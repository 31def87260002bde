"""``import triton_python_backend_utils as pb_utils``: Triton's python-backend module."""

from tritium.backends.python.pb_utils import *  # noqa: F403
from tritium.backends.python.pb_utils import __all__ as __all__
