"""Correct backends written differently from the built-in one, and the gate that runs
them through the conformance suite (``nox -s soundness``). Not installed."""
