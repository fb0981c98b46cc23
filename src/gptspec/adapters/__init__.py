"""gptspec.adapters — backends for engines written outside this project, each a small
adapter under the conformance protocol, registered in the ``gptspec.backends``
entry-point group, importing its engine only when used (an optional extra installs it).

* :mod:`gptspec.adapters.jax` — the model in JAX from the spec's equations, jit-compiled
  on the CPU (``--backend jax``); it does not import torch.
* :mod:`gptspec.adapters.transformers` — ``GPT2LMHeadModel`` (``hf-eager``, ``hf-sdpa``).
* :mod:`gptspec.adapters.onnx` — ONNX graphs from the spec's equations, run by ONNX
  Runtime on the CPU (``--backend onnxruntime``); it does not import torch.
* :mod:`gptspec.adapters.inputs` — the id and shape checks every adapter makes first;
  :mod:`gptspec.adapters.ecosystem` — ``nox -s ecosystem``: every engine through the suite.
"""
