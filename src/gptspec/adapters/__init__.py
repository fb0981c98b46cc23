"""gptspec.adapters — backends for engines written outside this project, each a small
adapter under the conformance protocol (``gptspec.conformance.protocol``) and registered
in the ``gptspec.backends`` entry-point group. Each one imports its engine only when it
is used; its dependency is an optional extra (``pip install 'gptspec[jax]'``, …).

* :mod:`gptspec.adapters.jax` — the model written in JAX from the spec's equations,
  jit-compiled on the CPU (``--backend jax``); it does not import torch.
* :mod:`gptspec.adapters.transformers` — transformers' ``GPT2LMHeadModel`` with eager or
  SDPA attention (``--backend hf-eager``, ``--backend hf-sdpa``).
* :mod:`gptspec.adapters.onnx` — ONNX graphs written from the spec's equations, run by ONNX
  Runtime on the CPU (``--backend onnxruntime``); it does not import torch.
* :mod:`gptspec.adapters.inputs` — the id and shape checks every adapter makes first;
  :mod:`gptspec.adapters.ecosystem` — ``nox -s ecosystem``: every engine through the suite.
"""
