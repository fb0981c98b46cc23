"""A stand-in for ``gptspec.fast.model.GPT`` while the fast backend is not installed.

Only what the figures need: pre-LN, tanh GELU, tied embeddings, parameters named by the
canonical schema. figures.py uses the real fast backend whenever it can be imported.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class StandInGPT(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        if (config.norm, config.ffn, config.tied_embeddings) != ("pre", "gelu_tanh", True):
            raise ValueError("the stand-in model supports only pre-LN, tanh GELU, tied")
        from gptspec.spec import init_parameters

        self.config = config
        # Schema names contain dots, which nn.Module attribute names cannot: keep them in
        # a plain dict and register each under a dot-free alias.
        self.schema: dict[str, nn.Parameter] = {}
        for name, value in init_parameters(config, seed=0).items():
            p = nn.Parameter(torch.tensor(value, dtype=torch.float32))
            self.register_parameter(name.replace(".", "__"), p)
            self.schema[name] = p

    def named_parameters(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, nn.Parameter]]:
        yield from self.schema.items()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        c, p = self.config, self.schema
        B, T = tokens.shape
        x = p["wte"][tokens] + p["wpe"][:T]
        for layer in range(c.n_layers):
            q = lambda n: p[f"blocks.{layer}.{n}"]  # noqa: B023 (used within the iteration)
            h = F.layer_norm(x, (c.d_model,), q("ln_1.weight"), q("ln_1.bias"), c.ln_eps)
            qkv = h @ q("attn.w_qkv") + q("attn.b_qkv")
            Q, K, V = (t.view(B, T, c.n_heads, c.d_head).transpose(1, 2)
                       for t in qkv.split(c.d_model, dim=-1))
            S = Q @ K.transpose(-1, -2) / math.sqrt(c.d_head)
            S = S.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
            heads = (S.softmax(-1) @ V).transpose(1, 2).reshape(B, T, c.d_model)
            x = x + heads @ q("attn.w_o") + q("attn.b_o")
            h = F.layer_norm(x, (c.d_model,), q("ln_2.weight"), q("ln_2.bias"), c.ln_eps)
            h = F.gelu(h @ q("ffn.w_1") + q("ffn.b_1"), approximate="tanh")
            x = x + h @ q("ffn.w_2") + q("ffn.b_2")
        x = F.layer_norm(x, (c.d_model,), p["ln_f.weight"], p["ln_f.bias"], c.ln_eps)
        return x @ p["wte"].T
