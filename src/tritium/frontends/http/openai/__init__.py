"""OpenAI's API (/v1: models, completions, chat completions) over the models tritium serves."""
