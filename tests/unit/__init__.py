"""Unit tests: pure pieces, no server."""
