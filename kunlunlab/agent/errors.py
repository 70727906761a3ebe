"""Errors the agent raises where a caller can act on them."""


class GenerationServiceError(RuntimeError):
    """An OpenAI-compatible generation server could not be reached or answered badly."""
