"""gptspec.adapters.jax — the decoder-only GPT written in JAX from the spec's equations,
jit-compiled on the CPU, as a conformance backend (``gptspec conformance --backend jax``).

``ops`` holds one function per spec entry under its reference name; ``sampling`` the
sampling distribution; ``backend`` the protocol (``JaxBackend``). Needs ``jax`` (the
``jax`` extra: ``pip install 'gptspec[jax]'``); never imports torch.
"""

from gptspec.adapters.jax.backend import JaxBackend

__all__ = ["JaxBackend"]
