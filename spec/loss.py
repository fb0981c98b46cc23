"""Spec entries: loss (declared by its issue; empty until then)."""
