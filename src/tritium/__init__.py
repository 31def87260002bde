"""tritium: a Python inference server speaking Triton's protocols."""

__version__ = "0.1.0"
