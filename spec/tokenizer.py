"""Spec entries: tokenizer (declared by its issue; empty until then)."""
