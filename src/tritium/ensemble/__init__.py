"""Ensembles: Triton's ``platform: "ensemble"`` pipelines of composing models."""
