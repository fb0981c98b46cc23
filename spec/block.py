"""Spec entries: block."""
