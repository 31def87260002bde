"""Fails in initialize, so the model is UNAVAILABLE."""


class TritonPythonModel:
    def initialize(self, args):
        raise ValueError("initialize refuses to start")

    def execute(self, requests):
        return []
