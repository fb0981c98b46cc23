"""The GPT model in PyTorch, built from ``gptspec.fast.ops``.

Read top to bottom: LayerNorm, Attention, FeedForward, Block, GPT. Every parameter is a
bare ``nn.Parameter`` named exactly as in the canonical schema
(``gptspec.spec.parameter_schema``): ``wte``, ``wpe``, ``blocks.0.ln_1.weight``,
``blocks.0.attn.w_qkv`` (d, 3d, used as x @ w_qkv), …, so a schema dict loads with no
renaming. Row vectors throughout: a linear map is x W + b with W of shape (in, out).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import numpy as np
import torch
import torch.nn as nn

from gptspec.fast import cpu_gelu, ops
from gptspec.fast.kv_cache import WHOLE_SEQUENCE, KVCache, Plan
from gptspec.fast.prepacked import operand
from gptspec.spec.config import GPTConfig
from gptspec.spec.parameters import check_parameters, parameter_schema

Tensor = torch.Tensor

DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A torch dtype from its name ("float32", "bfloat16", …) or itself."""
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"unsupported dtype {dtype}; use one of {', '.join(DTYPES)}")
        return dtype
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    return DTYPES[name]


def _empty(*shape: int) -> nn.Parameter:
    # filled by GPT.reset_parameters or replaced by GPT.from_parameters
    return nn.Parameter(torch.empty(*shape))


class LayerNorm(nn.Module):
    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.weight = _empty(d)
        self.bias = _empty(d)
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        p = cast("dict[str, Tensor]", self._parameters)  # (see GPT.run)
        return ops.layer_norm(x, p["weight"], p["bias"], self.eps)


class Attention(nn.Module):
    """Causal multi-head self-attention with a fused [W_Q | W_K | W_V] projection."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        d, a = config.d_model, config.d_attn  # a = h·d_k (d unless the head width is free)
        self.n_heads = config.n_heads
        self.w_qkv = _empty(d, 3 * a)
        self.b_qkv = _empty(3 * a) if config.attn_bias else None
        self.w_o = _empty(a, d)
        self.b_o = _empty(d) if config.attn_bias else None

    def forward(self, x: Tensor, plan: Plan = WHOLE_SEQUENCE, layer: int = 0) -> Tensor:
        p = cast("dict[str, Tensor]", self._parameters)  # (see GPT.run)
        Q, K, V = (ops.split_heads(X, self.n_heads)
                   for X in ops.qkv_projection(x, operand(self, p["w_qkv"]), p.get("b_qkv")))
        if plan.cache is not None:  # store the new keys and values, read every cached slot
            K, V = plan.cache.write(layer, K, V, plan)
        heads = ops.scaled_dot_product_attention(Q, K, V, plan.mask, is_causal=plan.causal)
        return ops.linear(ops.merge_heads(heads), operand(self, p["w_o"]), p.get("b_o"))


class FeedForward(nn.Module):
    """The position-wise FFN: ReLU, GELU or tanh-GELU MLP, or the Guide's product."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        d, f = config.d_model, config.d_ff
        second_in = d if config.ffn == "guide_product" else f  # the Guide's W_2 also reads x
        self.w_1 = _empty(d, f)
        self.b_1 = _empty(f) if config.ffn_bias else None
        self.w_2 = _empty(second_in, d)
        self.b_2 = _empty(d) if config.ffn_bias else None
        self.ffn = ops.FFN[config.ffn]

    def forward(self, x: Tensor) -> Tensor:
        p = cast("dict[str, Tensor]", self._parameters)  # (see GPT.run)
        return self.ffn(x, operand(self, p["w_1"]), p.get("b_1"), operand(self, p["w_2"]),
                        p.get("b_2"))


class Block(nn.Module):
    """One transformer block; the residual form (pre-LN, post-LN, the Guide's) is the
    same function as ``ops.block_*`` applies to a parameter dict."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(config.d_model, config.ln_eps)
        self.attn = Attention(config)
        self.ln_2 = LayerNorm(config.d_model, config.ln_eps) if config.norm != "guide" else None
        self.ffn = FeedForward(config)
        self.residual = ops.RESIDUAL[config.norm]

    def forward(self, x: Tensor, plan: Plan = WHOLE_SEQUENCE, layer: int = 0) -> Tensor:
        m = cast("dict[str, nn.Module]", self._modules)  # (see GPT.run)
        return self.residual(x, m["ln_1"], lambda h: m["attn"](h, plan, layer), m.get("ln_2"),
                             m["ffn"])


class GPT(nn.Module):
    """tokens (B, T) → logits (B, T, V).

    Typical use::

        model = GPT.from_parameters(params, config, dtype="bfloat16")  # or GPT(config, seed=0)
        logits = model(tokens)                                # (B, T, V), causal
        cache = model.new_cache(B)
        logits = model(prompts, cache=cache, lengths=n_real)  # right-padded prompts
        logits = model(next_tokens[:, None], cache=cache)     # one new token per sequence
    """

    def __init__(self, config: GPTConfig, *, device: torch.device | str | None = None,
                 dtype: torch.dtype | str | None = None, seed: int | None = 0) -> None:
        super().__init__()
        self.config = config
        c = config
        with torch.device(device if device is not None else "cpu"):
            self.wte = _empty(c.vocab_size, c.d_model)
            # no W_P for a model without positional embedding (the Guide as written)
            self.wpe = _empty(c.n_ctx, c.d_model) if c.positional_embedding else None
            self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layers))
            self.ln_f = LayerNorm(c.d_model, c.ln_eps) if c.final_norm else None
            self.w_u = _empty(c.d_model, c.vocab_size) if not c.tied_embeddings else None
            self.b_u = _empty(c.vocab_size) if c.output_bias else None
        # compute the unembedding with the vocabulary padded to a multiple of this (the same
        # logits; see ops.unembed_tied): compiled CUDA training sets 64
        self.vocab_multiple = 1
        if dtype is not None:
            self.to(resolve_dtype(dtype))
        if self.wte.device.type != "meta":
            self.reset_parameters(seed)

    # --- parameters ------------------------------------------------------------------------

    @torch.no_grad()
    def reset_parameters(self, seed: int | None = 0, std: float = 0.02) -> None:
        """GPT-2's initialisation (Radford et al. 2019, sec. 2.3), as the schema states it:
        N(0, std²), residual projections scaled by 1/√(2L), LayerNorm gains one, biases
        zero. The same distribution as ``gptspec.spec.init_parameters``; a torch generator
        on the CPU makes it reproducible on every device."""
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        params = dict(self.named_parameters())
        for s in parameter_schema(self.config):
            p = params[s.name]
            if s.init == "ones":
                p.fill_(1.0)
            elif s.init == "zeros":
                p.zero_()
            else:
                scale = std
                if s.init == "residual_normal":
                    scale /= (2 * self.config.n_layers) ** 0.5
                p.copy_(torch.randn(s.shape, generator=gen, dtype=torch.float32) * scale)

    @classmethod
    def from_parameters(cls, params: Mapping[str, Any], config: GPTConfig, *,
                        device: torch.device | str = "cpu",
                        dtype: torch.dtype | str = torch.float32) -> GPT:
        """A model holding ``params`` (a schema dict of NumPy arrays or tensors), converted to
        ``dtype`` on ``device``. Missing, unexpected or misshapen parameters raise
        ``gptspec.spec.ParameterError`` naming the parameter."""
        check_parameters(dict(params), config)
        torch_dtype = resolve_dtype(dtype)
        model = cls(config, device="meta")
        state = {}
        for name, value in params.items():
            tensor = value if isinstance(value, Tensor) else torch.as_tensor(np.asarray(value))
            state[name] = tensor.to(device=device, dtype=torch_dtype, copy=True)
        model.load_state_dict(state, strict=True, assign=True)
        return model

    def parameters_numpy(self) -> dict[str, np.ndarray]:
        """The parameters as a float64 NumPy schema dict."""
        return {name: p.detach().to("cpu", torch.float64).numpy()
                for name, p in self.named_parameters()}

    # --- forward -------------------------------------------------------------------------

    def forward(self, tokens: Tensor, cache: KVCache | None = None,
                lengths: Tensor | None = None, *, last_only: bool = False) -> Tensor:
        """Logits (B, T, V) of every position of ``tokens`` (B, T).

        With a ``cache``: ``tokens`` are the next T new tokens of each sequence; token i of
        sequence b takes position ``cache.lengths[b] + i``, its keys and values are cached,
        and only the new tokens' logits are returned. ``lengths`` (B,) says how many of the
        new tokens are real (right padding); the logits at padding are meaningless.
        Products by weights that ``gptspec.fast.prepacked.bind`` packed take its kernel.

        ``last_only=True`` returns only the logits of each sequence's last (real) new token,
        shape (B, 1, V), and skips the unembedding of the others."""
        tokens = self._check_tokens(tokens)
        B, T = tokens.shape
        if T == 0 and last_only:
            raise ValueError("last_only needs at least one token")
        if cache is not None:
            if cache.batch_size != B:
                raise ValueError(f"tokens have batch size {B}, the cache {cache.batch_size}")
            if cache.device != self.wte.device or cache.dtype != self.wte.dtype:
                raise ValueError(f"the cache is {cache.dtype} on {cache.device}, the model "
                                 f"{self.wte.dtype} on {self.wte.device}")
            plan = cache.plan(T, lengths)
        elif lengths is not None:
            raise ValueError("lengths is only meaningful with a cache")
        elif T > self.config.n_ctx:
            raise ValueError(f"sequence length {T} exceeds n_ctx={self.config.n_ctx}")
        if T == 0:
            return self.wte.new_empty(B, 0, self.config.vocab_size)
        if cache is None:
            return self._forward(tokens, last_only)
        return self.run(tokens, plan, last_only)

    def _forward(self, tokens: Tensor, last_only: bool = False) -> Tensor:
        """The whole sequence at once (what ``compile_model`` compiles)."""
        return self.run(tokens, WHOLE_SEQUENCE, last_only)

    def run(self, tokens: Tensor, plan: Plan, last_only: bool = False) -> Tensor:
        """The forward pass of checked ``tokens`` (B, T) placed by ``plan``: the whole
        sequence (``Plan()``), or new tokens at their positions in the plan's cache, which
        advances past them. The same operations in the same order on every path.

        The modules read their parameters from ``_parameters`` itself: an ``nn.Module``
        attribute lookup costs about a microsecond, paid some 200 times a decoding step."""
        T = tokens.shape[1]
        x = ops.token_embedding(tokens, self.wte)
        if self.wpe is not None:
            if plan.positions is None:  # positions start … start + T − 1
                P = ops.positional_embedding(plan.start + T, self.wpe)[plan.start :]
            else:
                P = ops.positional_embedding_at(plan.positions, self.wpe)
            x = ops.input_representation(x, P)
        for layer, block in enumerate(self.blocks):
            x = block(x, plan, layer)
        if plan.cache is not None:
            plan.cache.advance(plan, T)
        if last_only:
            x = x[:, -1:] if plan.last is None else \
                x.gather(1, plan.last[:, None, None].expand(-1, 1, x.shape[-1]))
        if self.ln_f is not None:
            x = ops.final_layer_norm(x, self.ln_f.weight, self.ln_f.bias, self.config.ln_eps)
        if self.w_u is None:
            return ops.unembed_tied(x, operand(self, self.wte), self.vocab_multiple)
        return ops.unembed_untied(x, operand(self, self.w_u), self.b_u, self.vocab_multiple)

    def _check_tokens(self, tokens: Tensor) -> Tensor:
        if not isinstance(tokens, Tensor):
            raise ValueError("tokens must be a torch LongTensor of shape (B, T), "
                             f"got {type(tokens).__name__}")
        if tokens.ndim != 2:
            raise ValueError(f"tokens must have shape (B, T), got {tuple(tokens.shape)}")
        if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
            raise ValueError(f"tokens must be integers, got {tokens.dtype}")
        tokens = tokens.to(device=self.wte.device, dtype=torch.long)
        if tokens.numel():
            lo, hi = torch.aminmax(tokens)
            if int(lo) < 0 or int(hi) >= self.config.vocab_size:
                raise ValueError(f"token ids must lie in [0, {self.config.vocab_size}), got "
                                 f"[{int(lo)}, {int(hi)}]")
        return tokens

    def new_cache(self, batch_size: int, max_len: int | None = None) -> KVCache:
        """A KV cache matching this model's configuration, device and dtype."""
        return KVCache(self.config, batch_size, self.wte.device, self.wte.dtype, max_len)


def compile_model(model: GPT, **options: Any) -> GPT:
    """The model with its whole-sequence path compiled by ``torch.compile`` (optional: the
    eager model is the same computation). Input checks and the KV-cache path stay eager:
    they read values from the device, and the cache's write offsets change every step.
    ``options`` go to torch.compile (e.g. ``mode="max-autotune"``, ``backend="eager"``)."""
    cpu_gelu.available()  # decided before tracing: compiled and eager take the same kernel
    model._forward = torch.compile(model._forward, **options)  # type: ignore[method-assign]
    return model
