"""Spec entries: optimizer (declared by its issue; empty until then)."""
