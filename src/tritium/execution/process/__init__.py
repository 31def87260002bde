"""The process instance kind: each model instance runs in its own process (a stub)."""
