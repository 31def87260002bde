"""repository package."""
