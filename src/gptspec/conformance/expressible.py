"""A drawn model in a configuration a backend can express (its ``supports``): an engine
that cannot turn off biases or learned positions, or tie its read-out, is judged on the
same function with those parts neutral (zero biases, W_P = 0, W_U = W_Eᵀ); one that
always applies a final LayerNorm gets gain 1 and bias 0, a changed function the verdict
still compares with the reference. Probes and generation checks share it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from gptspec.conformance.context import declared_support
from gptspec.conformance.protocol import NotApplicable
from gptspec.spec.config import GPTConfig

Params = dict[str, np.ndarray]


# Options an engine may not be able to turn off, and how to turn one on without changing
# the model's function: its new parameters are zero (a tied read-out becomes W_U = W_Eᵀ).
# Last, a final LayerNorm of gain 1 and bias 0 where an engine always applies one (GPT-2):
# that changes the function, so the probe then also judges LayerNorm, but the verdict is
# still the fitted model against the reference.
def fit_to_backend(config: GPTConfig, params: Params, backend: Any, keep_tied: bool = False
                   ) -> tuple[GPTConfig, Params]:
    """The same model in a configuration ``backend`` can express (its ``supports``), or
    NotApplicable naming why none fits."""
    supports = declared_support(backend)
    if supports is None or not supports(config):
        return config, params
    width, d = config.d_attn, config.d_model
    options = [("attn_bias", {"attn.b_qkv": (3 * width,), "attn.b_o": (d,)}),
               ("ffn_bias", {"ffn.b_1": (config.d_ff,), "ffn.b_2": (d,)}),
               ("positional_embedding", None), ("untie", None), ("final_norm", None)]
    off = [(name, new) for name, new in options
           if (name == "untie" and config.tied_embeddings and not keep_tied)
           or (name != "untie" and not getattr(config, name))]
    for chosen in range(1, 2 ** len(off)):
        turned = [off[i] for i in range(len(off)) if chosen >> i & 1]
        fields: dict[str, Any] = {name: True for name, _ in turned if name != "untie"}
        if any(name == "untie" for name, _ in turned):
            fields["tied_embeddings"] = False
        candidate = dataclasses.replace(config, **fields)
        if supports(candidate):
            continue
        fitted = dict(params)
        for name, new in turned:
            if name == "positional_embedding":
                fitted["wpe"] = np.zeros((config.n_ctx, d))
            elif name == "final_norm":
                fitted["ln_f.weight"], fitted["ln_f.bias"] = np.ones(d), np.zeros(d)
            elif name == "untie":
                fitted["w_u"] = np.asarray(params["wte"]).T.copy()
            else:
                for layer in range(config.n_layers):
                    for key, shape in (new or {}).items():
                        fitted[f"blocks.{layer}.{key}"] = np.zeros(shape)
        return candidate, fitted
    # the reason that remains with every option turned on: what the probe itself needs
    raise NotApplicable(supports(candidate) if off else supports(config))
