"""Benchmarks run by ``nox -s bench`` (see benchmarks/run.py)."""
