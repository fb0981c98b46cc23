"""Spec entries: sampling (declared by its issue; empty until then)."""
