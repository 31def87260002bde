"""python package."""
