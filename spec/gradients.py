"""Spec entries: gradients (declared by its issue; empty until then)."""
