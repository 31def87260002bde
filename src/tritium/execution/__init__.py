"""execution package."""
