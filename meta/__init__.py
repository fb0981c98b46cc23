"""The suite's own test tooling, never installed: the mutation catalog and its runner
(``mutants``, ``mutation``), the built-in backend with a fused attention kernel forced
(``sdpa_kernels``), and the soundness gate's correct variants (``soundness``).

Run from the repository root (``python -m meta.mutation``); pytest finds it through the
``pythonpath`` setting in pyproject.toml.
"""
