"""Placeholder: filled in by the foundation work."""

__all__: list[str] = []
