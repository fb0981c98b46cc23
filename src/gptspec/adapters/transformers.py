"""transformers' ``GPT2LMHeadModel`` as a conformance backend, validated as it is.

Two backends, one per attention implementation: ``hf-eager`` and ``hf-sdpa`` (PyTorch's
fused ``scaled_dot_product_attention``), in float32 or bfloat16 on the CPU, built from
the schema parameters by ``gptspec.fast.hf_interop`` (weights handed over unchanged). It
offers ``forward``, ``generate`` through the engine's own ``generate()``,
``sampling_distribution`` (what transformers' processors define), GPT-2's own modules
where one computes a spec entry alone (gelu_new, LayerNorm, GPT2MLP) and ``gpt_backward``
(transformers' loss, torch's autograd). What GPT-2 cannot express it declares
(``supports``) and refuses with a one-line reason (``NotApplicable``): another block,
FFN, norm or output structure, or generation past n_positions (it cannot crop).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from gptspec.conformance.protocol import NotApplicable
from gptspec.fast import hf_interop
from gptspec.spec.config import GPTConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class TransformersBackend:
    """``GPT2LMHeadModel`` with one attention implementation, on the CPU."""

    protocol_version = 2  # gptspec.conformance.protocol: forward(tokens, params, config)
    attn_implementation = "eager"
    KEEP_MODELS = 4

    def __init__(self, device: str = "cpu", dtype: str = "float32") -> None:
        import transformers

        if dtype not in DTYPES:
            raise ValueError(f"the transformers backend runs in {', '.join(DTYPES)}, not {dtype!r}")
        if device != "cpu":
            raise ValueError(f"the transformers backend runs on the CPU only, not {device!r}")
        self.name = f"hf-{self.attn_implementation}"
        self.dtype, self.device = dtype, device
        self.torch_dtype = DTYPES[dtype]
        self.version = (f"transformers {transformers.__version__} "
                        f"(attn_implementation={self.attn_implementation!r}), "
                        f"torch {torch.__version__}")
        self._models: dict[tuple[GPTConfig, Any], Any] = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.device!r}, dtype={self.dtype!r})"

    # --- what GPT-2 can express ------------------------------------------------------------

    @staticmethod
    def supports(config: GPTConfig) -> str | None:
        """None if GPT2LMHeadModel can hold this configuration, else why not (one line)."""
        try:
            hf_interop.check_expressible(config)
        except hf_interop.InteropError as err:
            return str(err)
        return None

    def _require(self, config: GPTConfig) -> None:
        reason = self.supports(config)
        if reason:
            raise NotApplicable(reason)

    def model(self, params: Mapping[str, Any], config: GPTConfig, dtype: Any = None) -> Any:
        """A GPT2LMHeadModel of ``config`` holding ``params`` in ``dtype`` (the backend's by
        default); the last few are kept and refilled in place."""
        self._require(config)
        dtype = dtype or self.torch_dtype
        model = self._models.pop((config, dtype), None)
        if model is None:
            model = hf_interop.to_hf_model(params, config, dtype=dtype)
            model.set_attn_implementation(self.attn_implementation)
        else:
            state = hf_interop.params_to_hf(params, config, dtype=dtype)
            model.load_state_dict(state, strict=False)
            if config.tied_embeddings:
                model.tie_weights()
        self._models[(config, dtype)] = model
        while len(self._models) > self.KEEP_MODELS:
            self._models.pop(next(iter(self._models)))
        return model

    # --- the protocol ------------------------------------------------------------------------

    @torch.no_grad()
    def forward(self, tokens: Any, params: Mapping[str, Any], config: GPTConfig) -> np.ndarray:
        ids = torch.as_tensor(np.asarray(tokens), dtype=torch.long)
        logits = self.model(params, config)(input_ids=ids).logits
        return logits.float().numpy()

    # --- GPT-2's own modules, one operation each ---------------------------------------------

    def _tensor(self, a: Any) -> torch.Tensor:
        """A NumPy input as a tensor of the dtype (the protocol: float64 in, rounded once)."""
        return torch.as_tensor(np.asarray(a, dtype=np.float64)).to(self.torch_dtype)

    @torch.no_grad()
    def gelu_tanh(self, x: Any) -> np.ndarray:
        """GPT-2's activation, transformers' own ``ACT2FN["gelu_new"]``."""
        from transformers.activations import ACT2FN

        return ACT2FN["gelu_new"](self._tensor(x)).double().numpy()

    @torch.no_grad()
    def layer_norm(self, x: Any, gamma: Any, beta: Any, eps: float) -> np.ndarray:
        """GPT-2's LayerNorm module (``torch.nn.LayerNorm`` with layer_norm_epsilon)."""
        x = self._tensor(x)
        norm = torch.nn.LayerNorm(x.shape[-1], eps=eps, dtype=self.torch_dtype)
        norm.weight.copy_(self._tensor(gamma))
        norm.bias.copy_(self._tensor(beta))
        return norm(x).double().numpy()

    def final_layer_norm(self, H: Any, gamma: Any, beta: Any, eps: float) -> np.ndarray:
        """GPT-2's ln_f: the same module as the blocks' (see layer_norm)."""
        return self.layer_norm(H, gamma, beta, eps)

    @torch.no_grad()
    def ffn_gelu_tanh(self, x: Any, W_1: Any, b_1: Any, W_2: Any, b_2: Any) -> np.ndarray:
        """transformers' ``GPT2MLP`` (Conv1D c_fc, gelu_new, Conv1D c_proj) holding these
        weights: Conv1D stores (in, out), the schema's layout."""
        from transformers import GPT2Config
        from transformers.models.gpt2.modeling_gpt2 import GPT2MLP

        d, d_ff = np.shape(W_1)
        mlp = GPT2MLP(d_ff, GPT2Config(n_embd=d, n_inner=d_ff, activation_function="gelu_new",
                                       resid_pdrop=0.0)).to(self.torch_dtype).eval()
        for module, w, b in ((mlp.c_fc, W_1, b_1), (mlp.c_proj, W_2, b_2)):
            module.weight.copy_(self._tensor(w))
            module.bias.copy_(self._tensor(b))
        return mlp(self._tensor(x)).double().numpy()

    def gpt_backward(self, tokens: Any, targets: Any, params: Mapping[str, Any],
                     config: GPTConfig) -> tuple[float, dict[str, np.ndarray]]:
        """The loss GPT2LMHeadModel computes for these targets (transformers' causal-LM
        loss, given the targets as ``shift_labels`` so that every position is scored) and
        torch's autograd through the engine's model: the gradient of each parameter by
        schema name (w_u's transposed back from lm_head). In a 16-bit dtype it trains as
        transformers' Trainer does with ``bf16=True``/``fp16=True``: float32 weights (holding
        the 16-bit values) under ``torch.autocast``, so gradients are float32."""
        sixteen = self.torch_dtype != torch.float32
        model = self.model(params, config, torch.float32)
        model.zero_grad(set_to_none=True)
        ids = torch.as_tensor(np.asarray(tokens), dtype=torch.long)
        labels = torch.as_tensor(np.asarray(targets), dtype=torch.long)
        autocast = (torch.autocast("cpu", dtype=self.torch_dtype) if sixteen
                    else contextlib.nullcontext())
        with torch.enable_grad(), autocast:
            for p in model.parameters():
                p.requires_grad_(True)
            loss = model(input_ids=ids, labels=labels, shift_labels=labels).loss
            loss.backward()
        grads = {name: param.grad for name, param in model.named_parameters()}
        out = {}
        for name in params:
            g = grads[hf_interop.hf_name(name)]
            g = torch.zeros_like(model.get_parameter(hf_interop.hf_name(name))) if g is None else g
            out[name] = (g.T if name == "w_u" else g).double().numpy().copy()
        model.zero_grad(set_to_none=True)
        return float(loss.detach()), out

    @torch.no_grad()
    def sampling_distribution(self, z: Any, temperature: float = 1.0, top_k: int | None = None,
                              top_p: float | None = None) -> np.ndarray:
        """softmax of transformers' own processors (temperature, top-k, top-p, in the order
        ``generate`` applies them) on one row of logits; τ = 0 is the argmax's one-hot."""
        scores = torch.as_tensor(np.asarray(z, dtype=np.float64)).to(self.torch_dtype)
        scores = scores.float().reshape(1, -1)  # generate() processes float32 scores
        if temperature == 0:
            out = torch.zeros_like(scores)
            out[0, int(torch.argmax(scores))] = 1.0
            return out[0].numpy()
        processed = _processors(temperature, top_k, top_p)(torch.zeros((1, 1), dtype=torch.long),
                                                           scores)
        return torch.softmax(processed, dim=-1)[0].numpy()

    @torch.no_grad()
    def generate(self, prompts: Any, params: Mapping[str, Any], config: GPTConfig,
                 max_new_tokens: int, *, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, eot_token: int | None = None,
                 rng: np.random.Generator | None = None, return_logits: bool = False) -> Any:
        """``model.generate`` on each prompt alone (no padding to reason about). Sampling
        draws from torch's generator, seeded from ``rng``: the same seed, the same tokens.
        A prompt and generation longer than n_ctx is not applicable: GPT-2's generate has
        no context cropping (its position table ends at n_positions)."""
        model = self.model(params, config)
        too_long = [len(p) + max_new_tokens for p in prompts if len(p) + max_new_tokens - 1 >
                    config.n_ctx]
        if too_long:
            raise NotApplicable(f"transformers' generate does not crop the context: this "
                                f"generation needs {max(too_long) - 1} positions, "
                                f"n_positions={config.n_ctx}")
        sample = temperature > 0
        if sample and rng is None:
            raise ValueError("sampling (temperature > 0) needs an explicit seeded rng")
        tokens_out, logits_out = [], []
        for prompt in prompts:
            ids = torch.as_tensor([list(prompt)], dtype=torch.long)
            options: dict[str, Any] = dict(
                max_new_tokens=max_new_tokens, min_new_tokens=0, do_sample=sample,
                eos_token_id=eot_token, pad_token_id=eot_token if eot_token is not None else 0,
                return_dict_in_generate=True, output_logits=True, top_k=None, top_p=None,
                temperature=None)
            if sample:
                assert rng is not None
                torch.manual_seed(int(rng.integers(0, 2**63 - 1)))
                options.update(temperature=float(temperature), top_k=top_k, top_p=top_p)
            out = model.generate(ids, attention_mask=torch.ones_like(ids), **options)
            new = [int(t) for t in out.sequences[0, ids.shape[1]:]]
            tokens_out.append(new)
            logits_out.append(torch.cat([s.float() for s in out.logits]).numpy()[: len(new)]
                              if new else np.zeros((0, config.vocab_size), np.float32))
        return (tokens_out, logits_out) if return_logits else tokens_out


def _processors(temperature: float, top_k: int | None, top_p: float | None) -> Any:
    """transformers' logits processors for these settings, in generate()'s order."""
    from transformers import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    chain: list[Any] = [TemperatureLogitsWarper(float(temperature))]
    if top_k is not None:
        chain.append(TopKLogitsWarper(int(top_k)))
    if top_p is not None and top_p < 1:
        chain.append(TopPLogitsWarper(float(top_p)))
    return LogitsProcessorList(chain)


class EagerBackend(TransformersBackend):
    """GPT-2's eager attention (``attn_implementation="eager"``)."""

    attn_implementation = "eager"


class SdpaBackend(TransformersBackend):
    """PyTorch's fused attention (``attn_implementation="sdpa"``)."""

    attn_implementation = "sdpa"


class LogitsOnlyBackend:
    """transformers' GPT-2 as most engines are brought: ``forward`` (logits) and what it can
    express (``supports``), nothing else. The suite judges it through the probes and drives
    generation and sampling through its logits (``hf-logits``)."""

    protocol_version = 2

    def __init__(self, device: str = "cpu", dtype: str = "float32") -> None:
        self._engine = SdpaBackend(device, dtype)
        self.name = "hf-logits"
        self.version, self.device, self.dtype = (self._engine.version, self._engine.device,
                                                 self._engine.dtype)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.device!r}, dtype={self.dtype!r})"

    supports = staticmethod(TransformersBackend.supports)

    def forward(self, tokens: Any, params: Mapping[str, Any], config: GPTConfig) -> np.ndarray:
        return self._engine.forward(tokens, params, config)


__all__ = ["EagerBackend", "LogitsOnlyBackend", "SdpaBackend", "TransformersBackend"]
