"""core package."""
