"""gptspec — a spec-driven, verified reference implementation of the decoder-only GPT.

Layout: ``gptspec.spec`` (the equations) → ``gptspec.reference`` (float64 NumPy) →
``gptspec.fast`` (PyTorch), with ``gptspec.conformance`` checking backends against the
reference.
"""

__version__ = "0.1.0"
