"""Spec entries: costs (declared by its issue; empty until then)."""
