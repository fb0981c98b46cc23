"""Reference: backward (filled by its issue)."""

__all__: list[str] = []
