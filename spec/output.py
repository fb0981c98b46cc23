"""Spec entries: output."""
