"""Spec entries: embedding."""
