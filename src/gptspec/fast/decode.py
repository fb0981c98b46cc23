"""The decoding step with the module machinery taken out: one new token per sequence.

At batch 1 a step's time is mostly reading the weights, so what a ``GPT`` module call
adds around the products (dozens of module calls, a weight lookup per product, the
cache's general plan with its mask, the token checks) is a visible share, paid at every
token; ``benchmarks/generation.py`` measures it. ``DecodeStep`` runs the common step
(every sequence one new token, all at one position) as one flat loop over weights bound
once: the same ``ops`` in the same order, so its logits equal the model's bit for bit
(tests/test_decode.py), and the generation checks run through it. Any other step
(prompts, padding, stopped sequences) goes through the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F

from gptspec.fast import ops
from gptspec.fast.kv_cache import KVCache
from gptspec.fast.model import GPT, Block
from gptspec.fast.prepacked import PackedMatrix, PrepackedWeights

Tensor = torch.Tensor
Product = Callable[[Tensor], Tensor]  # x ↦ x W + b, the weights bound


def _operand(W: Tensor, packed: PrepackedWeights | None) -> Tensor | PackedMatrix:
    return W if packed is None else packed.operand(W)


def _product(W: Tensor, b: Tensor | None, packed: PrepackedWeights | None) -> Product:
    """``ops.linear(·, W, b)`` with the lookup of W's packed form done once."""
    matrix = _operand(W, packed)
    if isinstance(matrix, PackedMatrix):
        return lambda x: matrix(x, b)
    return lambda x: F.linear(x, W.t(), b)


def _tied_unembedding(W_E: Tensor, packed: PrepackedWeights | None) -> Product:
    """``ops.unembed_tied(·, W_E)``, likewise."""
    matrix = _operand(W_E, packed)
    if isinstance(matrix, PackedMatrix):
        return lambda H: matrix(H, None)
    return lambda H: F.linear(H, W_E)


@dataclass(frozen=True)
class _Layer:
    """One block's weights, bound: its LayerNorms' (γ, β) and its four products."""

    ln_1: tuple[Tensor, Tensor]
    ln_2: tuple[Tensor, Tensor] | None
    qkv: Product
    out: Product
    ffn_in: Product
    ffn_out: Product


# the FFN activations ops.ffn_* apply between their two products
_ACTIVATION: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": ops.relu, "gelu": ops.gelu, "gelu_tanh": ops.gelu_tanh,
}


class DecodeStep:
    """``step(tokens, cache)``: logits (B, V) of one new token per sequence, equal to
    ``model(tokens[:, None], cache=cache)[:, 0]`` for a cache whose sequences all have the
    same length (``applies_to(cache)``); the cache advances by one.

    Built for one model's current weights (``packed``: their prepacked forms, if any);
    build a new one after the weights change. Every residual form and FFN of the spec is
    covered except the Guide's product FFN, which the model computes instead."""

    def __init__(self, model: GPT, packed: PrepackedWeights | None = None) -> None:
        c = model.config
        self.config = c
        self.residual = ops.RESIDUAL[c.norm]
        self.activation = _ACTIVATION[c.ffn]
        self.wte, self.wpe = model.wte, model.wpe
        self.layers = [
            _Layer(
                ln_1=(block.ln_1.weight, block.ln_1.bias),
                ln_2=None if block.ln_2 is None else (block.ln_2.weight, block.ln_2.bias),
                qkv=_product(block.attn.w_qkv, block.attn.b_qkv, packed),
                out=_product(block.attn.w_o, block.attn.b_o, packed),
                ffn_in=_product(block.ffn.w_1, block.ffn.b_1, packed),
                ffn_out=_product(block.ffn.w_2, block.ffn.b_2, packed),
            )
            for block in cast("list[Block]", model.blocks)
        ]
        self.ln_f = None if model.ln_f is None else (model.ln_f.weight, model.ln_f.bias)
        if model.w_u is None:
            self.unembed = _tied_unembedding(model.wte, packed)
        else:
            self.unembed = _product(model.w_u, model.b_u, packed)
        self._packed = [] if packed is None else list(packed.table.values())

    @staticmethod
    def supports(model: GPT) -> bool:
        return model.config.ffn in _ACTIVATION

    @property
    def current(self) -> bool:
        """No packed matrix went stale (the parameters themselves are bound, so plain
        products always see their current values)."""
        return all(matrix.current for matrix in self._packed)

    @staticmethod
    def applies_to(cache: KVCache) -> bool:
        """Whether the cache's sequences share one length, with room for one more token."""
        slot = cache.uniform_length
        return slot is not None and slot < cache.max_len

    def __call__(self, tokens: Tensor, cache: KVCache) -> Tensor:
        c, eps = self.config, self.config.ln_eps
        assert self.applies_to(cache)
        t = cache.uniform_length  # every new token's position and cache slot
        assert t is not None
        x = ops.token_embedding(tokens[:, None], self.wte)
        if self.wpe is not None:
            x = ops.input_representation(x, self.wpe[t : t + 1])
        for index, layer in enumerate(self.layers):

            def ln_1(h: Tensor, p: tuple[Tensor, Tensor] = layer.ln_1) -> Tensor:
                return ops.layer_norm(h, p[0], p[1], eps)

            def ln_2(h: Tensor, p: tuple[Tensor, Tensor] | None = layer.ln_2) -> Tensor:
                assert p is not None
                return ops.layer_norm(h, p[0], p[1], eps)

            def attend(h: Tensor, layer: _Layer = layer, index: int = index) -> Tensor:
                Q, K, V = (ops.split_heads(X, c.n_heads) for X in layer.qkv(h).split(c.d_attn, -1))
                K, V = cache.append(index, K, V)  # every slot 0 … t is visible: no mask
                return layer.out(ops.merge_heads(ops.scaled_dot_product_attention(Q, K, V)))

            def ffn(h: Tensor, layer: _Layer = layer) -> Tensor:
                return layer.ffn_out(self.activation(layer.ffn_in(h)))

            x = self.residual(x, ln_1, attend, ln_2, ffn)
        cache.appended()
        if self.ln_f is not None:
            x = ops.final_layer_norm(x, self.ln_f[0], self.ln_f[1], eps)
        return self.unembed(x)[:, 0]
