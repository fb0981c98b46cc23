"""Spec entries: attention."""
