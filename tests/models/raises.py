"""Raises from execute, so every request of the call fails."""


class TritonPythonModel:
    def execute(self, requests):
        raise RuntimeError("this model always fails")
