"""A catalog of realistic bugs planted in the fast backend, to show the suite catches them.

Each :class:`Mutant` is one bug a backend author could plausibly write, named, explained
and tied to the spec entries it breaks (``breaks``), in the forward pass, training, the
tokenizer or generation. A forward mutant is a :class:`MutantTorchBackend`: the built-in
backend with functions of ``gptspec.fast.ops`` replaced while it runs, so the bug reaches
every path built from them; a generation mutant replaces a function of ``generate`` or a
KV-cache method likewise; a tokenizer mutant brings a subclass of the fast tokenizer. The
catalog lives beside the backend, not in the judge (``gptspec.conformance`` knows no
backend); ``meta.mutation`` reports per mutant the first failing check ("killed by") and
whether it names an entry the mutant breaks.
"""

from __future__ import annotations

import codecs
import contextlib
import math
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import regex
import torch
import torch.nn.functional as F

from gptspec.fast import ops
from gptspec.fast.backend import TorchBackend
from gptspec.fast.tokenizer import FastTokenizerBackend, Tokenizer
from gptspec.reference import tokenizer as ref_tok

Tensor = torch.Tensor


@dataclass(frozen=True)
class Mutant:
    name: str
    breaks: tuple[str, ...]  # the spec entries the bug breaks: a killing check should name one
    area: str  # which part of the suite is run against it
    doc: str
    patches: Mapping[str, Callable[..., Any]] = field(default_factory=dict)  # ops.<name>
    make_backend: Callable[[], Any] | None = None
    # other functions replaced, by dotted path ("gptspec.fast.sampling.top_k_filter")
    elsewhere: Mapping[str, Any] = field(default_factory=dict)  # functions, or data
    dtype: str | None = None  # a bug only one dtype's code path has is run in that dtype
    # a code path only some machines take: (what it needs, whether this machine has it)
    requires: tuple[str, Callable[[], bool]] | None = None

    def missing_here(self) -> str | None:
        """What this machine lacks to take the mutated code path (the bug cannot run
        here, so no check can see it), or None."""
        if self.requires is None or self.requires[1]():
            return None
        return self.requires[0]

    def backend(self, device: str = "cpu", dtype: str = "float32") -> Any:
        if self.make_backend is not None:
            return self.make_backend()
        return MutantTorchBackend(self.name, self.patches, device=device,
                                  dtype=self.dtype or dtype, elsewhere=self.elsewhere)


def _owner(path: str) -> tuple[Any, str]:
    """The object holding the attribute named by a dotted path, and the attribute's name."""
    import importlib

    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:-1]:
            obj = getattr(obj, part)
        return obj, parts[-1]
    raise ImportError(f"cannot resolve {path!r}")


@contextlib.contextmanager
def patched_paths(patches: Mapping[str, Any]) -> Iterator[None]:
    """Replace attributes named by dotted paths while the block runs."""
    saved = []
    try:
        for path, fn in patches.items():
            owner, name = _owner(path)
            saved.append((owner, name, owner.__dict__[name]))
            setattr(owner, name, fn)
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


@contextlib.contextmanager
def patched_ops(patches: Mapping[str, Callable[..., Any]]) -> Iterator[None]:
    """Replace functions of gptspec.fast.ops while the block runs (and the dispatch tables
    FFN and RESIDUAL, which hold the functions themselves)."""
    saved = {name: getattr(ops, name) for name in (*patches, "FFN", "RESIDUAL")}
    try:
        for name, fn in patches.items():
            setattr(ops, name, fn)
        ops.FFN = {k: getattr(ops, f.__name__) for k, f in saved["FFN"].items()}
        ops.RESIDUAL = {k: getattr(ops, f.__name__) for k, f in saved["RESIDUAL"].items()}
        yield
    finally:
        for name, fn in saved.items():
            setattr(ops, name, fn)


class MutantTorchBackend(TorchBackend):
    """TorchBackend with some of its operations replaced by buggy ones."""

    def __init__(self, mutant: str, patches: Mapping[str, Callable[..., Any]],
                 device: str = "cpu", dtype: str = "float32",
                 elsewhere: Mapping[str, Any] | None = None) -> None:
        super().__init__(device=device, dtype=dtype)
        self.name = f"torch+{mutant}"
        self.patches = dict(patches)
        self.elsewhere = dict(elsewhere or {})

    @contextlib.contextmanager
    def _mutated(self) -> Iterator[None]:
        with patched_ops(self.patches), patched_paths(self.elsewhere):
            yield

    def forward(self, tokens: Any, params: Any, config: Any) -> Any:
        with self._mutated():
            return super().forward(tokens, params, config)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        with self._mutated():
            return super().generate(*args, **kwargs)

    def sampling_distribution(self, *args: Any, **kwargs: Any) -> Any:
        with self._mutated():
            return super().sampling_distribution(*args, **kwargs)

    def gpt_backward(self, *args: Any, **kwargs: Any) -> Any:
        with self._mutated():
            return super().gpt_backward(*args, **kwargs)

    def train_loop(self, *args: Any, **kwargs: Any) -> Any:
        with self._mutated():
            return super().train_loop(*args, **kwargs)

    def train_losses(self, *args: Any, **kwargs: Any) -> Any:
        with self._mutated():
            return super().train_losses(*args, **kwargs)

    def _wrap(self, name: str) -> Callable[..., Any]:
        def op(*args: Any, **kwargs: Any) -> Any:
            with self._mutated():  # _wrap looks the function up inside
                return TorchBackend._wrap(self, name)(*args, **kwargs)

        op.__name__ = op.__qualname__ = name
        return op


# --- the forward bugs -------------------------------------------------------------------
# Each function below replaces the gptspec.fast.ops function of the same role.


def _mask_shifted_by_one(T: int, *, dtype: torch.dtype = torch.float32,
                         device: Any = None) -> Tensor:
    return torch.full((T, T), -math.inf, dtype=dtype, device=device).triu(2)


def _mask_hides_diagonal(T: int, *, dtype: torch.dtype = torch.float32,
                         device: Any = None) -> Tensor:
    # every position masked from itself: row 0 is all −∞
    return torch.full((T, T), -math.inf, dtype=dtype, device=device).triu(0)


def _scores_unscaled(Q: Tensor, K: Tensor, M: Tensor) -> Tensor:
    return Q @ K.transpose(-1, -2) + M


def _scores_scaled_by_dk(Q: Tensor, K: Tensor, M: Tensor) -> Tensor:
    return Q @ K.transpose(-1, -2) / Q.shape[-1] + M


def _sdpa_unscaled(Q: Tensor, K: Tensor, V: Tensor, M: Tensor | None = None, *,
                   is_causal: bool = False) -> Tensor:
    return F.scaled_dot_product_attention(Q, K, V, attn_mask=M, is_causal=is_causal, scale=1.0)


def _softmax_wrong_axis(z: Tensor, axis: int = -1) -> Tensor:
    dim = -2 if z.dim() > 1 and axis in (-1, z.dim() - 1) else axis
    return torch.softmax(z, dim=dim, dtype=ops.accumulation_dtype(z.dtype)).to(z.dtype)


def _softmax_without_max_shift(z: Tensor, axis: int = -1) -> Tensor:
    e = torch.exp(z.to(ops.accumulation_dtype(z.dtype)))
    return (e / e.sum(dim=axis, keepdim=True)).to(z.dtype)


def _attention_weights_masked_after_softmax(Q: Tensor, K: Tensor, M: Tensor) -> Tensor:
    # softmax over the unmasked scores, then the future zeroed: rows no longer sum to 1
    A = ops.softmax(Q @ K.transpose(-1, -2) / math.sqrt(Q.shape[-1]), axis=-1)
    return A.masked_fill(torch.isinf(M), 0.0)


def _layer_norm_unbiased(x: Tensor, gamma: Tensor, beta: Tensor, eps: float) -> Tensor:
    acc = ops.accumulation_dtype(x.dtype)
    xa = x.to(acc)
    mu = xa.mean(-1, keepdim=True)
    var = xa.var(-1, keepdim=True, unbiased=True) if x.shape[-1] > 1 else torch.zeros_like(mu)
    return (gamma.to(acc) * (xa - mu) / torch.sqrt(var + eps) + beta.to(acc)).to(x.dtype)


def _layer_norm_eps_outside_root(x: Tensor, gamma: Tensor, beta: Tensor, eps: float) -> Tensor:
    acc = ops.accumulation_dtype(x.dtype)
    xa = x.to(acc)
    mu = xa.mean(-1, keepdim=True)
    sd = xa.var(-1, keepdim=True, unbiased=False).sqrt()
    return (gamma.to(acc) * (xa - mu) / (sd + eps) + beta.to(acc)).to(x.dtype)


def _final_layer_norm_skipped(H: Tensor, gamma: Tensor, beta: Tensor, eps: float) -> Tensor:
    return H


def _split_heads_without_transpose(X: Tensor, n_heads: int) -> Tensor:
    *lead, T, d = X.shape
    return X.reshape(*lead, n_heads, T, d // n_heads)


def _merge_heads_without_transpose(X: Tensor) -> Tensor:
    *lead, h, T, dk = X.shape
    return X.reshape(*lead, T, h * dk)


def _mha_without_w_o(H: Tensor, W_qkv: Tensor, b_qkv: Tensor | None, W_O: Tensor,
                     b_O: Tensor | None, n_heads: int) -> Tensor:
    Q, K, V = (ops.split_heads(X, n_heads) for X in ops.qkv_projection(H, W_qkv, b_qkv))
    heads = ops.scaled_dot_product_attention(Q, K, V, is_causal=True)
    out = ops.merge_heads(heads)
    return out if b_O is None else out + b_O


def _head_sum_w_o_by_columns(H: Tensor, W_qkv: Tensor, b_qkv: Tensor | None, W_O: Tensor,
                             b_O: Tensor | None, n_heads: int) -> Tensor:
    # W_O⁽ⁱ⁾ cut from the columns of W_O instead of its rows
    Q, K, V = (ops.split_heads(X, n_heads) for X in ops.qkv_projection(H, W_qkv, b_qkv))
    heads = ops.scaled_dot_product_attention(Q, K, V, is_causal=True)
    d = W_O.shape[0]
    W_heads = W_O.t().reshape(n_heads, d // n_heads, W_O.shape[1])
    out = torch.einsum("...htk,hkd->...td", heads, W_heads)
    return out if b_O is None else out + b_O


def _qkv_k_v_swapped(H: Tensor, W_qkv: Tensor, b_qkv: Tensor | None = None
                     ) -> tuple[Tensor, Tensor, Tensor]:
    QKV = ops.linear(H, W_qkv, b_qkv)
    Q, K, V = QKV.split(QKV.shape[-1] // 3, dim=-1)
    return Q, V, K


def _linear_bias_dropped(x: Tensor, W: Tensor, b: Tensor | None = None) -> Tensor:
    return F.linear(x, W.t())


def _gelu_tanh_is_exact(x: Tensor) -> Tensor:
    return F.gelu(x)


def _gelu_is_tanh(x: Tensor) -> Tensor:
    return F.gelu(x, approximate="tanh")


def _relu_leaky(x: Tensor) -> Tensor:
    return F.leaky_relu(x, 0.01)


def _ffn_gelu_with_tanh(x: Tensor, W_1: Tensor, b_1: Tensor | None, W_2: Tensor,
                        b_2: Tensor | None) -> Tensor:
    return ops.linear(ops.gelu_tanh(ops.linear(x, W_1, b_1)), W_2, b_2)


def _ffn_relu_without_b2(x: Tensor, W_1: Tensor, b_1: Tensor | None, W_2: Tensor,
                         b_2: Tensor | None) -> Tensor:
    return ops.linear(ops.relu(ops.linear(x, W_1, b_1)), W_2, None)


def _guide_product_summed(x: Tensor, W_1: Tensor, b_1: Tensor | None, W_2: Tensor,
                          b_2: Tensor | None) -> Tensor:
    return ops.relu(ops.linear(x, W_1, b_1)) + ops.relu(ops.linear(x, W_2, b_2))


def _pre_ln_second_residual_from_input(H: Tensor, ln_1: Any, attn: Any, ln_2: Any,
                                       ffn: Any) -> Tensor:
    H1 = H + attn(ln_1(H))
    return H + ffn(ln_2(H1))  # the FFN's residual taken from the block input, not H'


def _post_ln_normalises_first(H: Tensor, ln_1: Any, attn: Any, ln_2: Any, ffn: Any) -> Tensor:
    H = H + attn(ln_1(H))  # pre-LN written where post-LN is configured
    return H + ffn(ln_2(H))


def _guide_without_residual(H: Tensor, ln_1: Any, attn: Any, ln_2: Any, ffn: Any) -> Tensor:
    return ln_1(ffn(attn(H)))


def _positions_off_by_one(T: int, W_P: Tensor) -> Tensor:
    return torch.roll(W_P, -1, dims=0)[:T]


def _token_embedding_off_by_one(tokens: Tensor, W_E: Tensor) -> Tensor:
    return F.embedding((tokens + 1) % W_E.shape[0], W_E)


def _embeddings_scaled(E: Tensor, P: Tensor) -> Tensor:
    # Vaswani et al. scale the token embedding by √d_model; this model does not
    return E * math.sqrt(E.shape[-1]) + P


def _unembed_untied_without_bias(H: Tensor, W_U: Tensor, b_U: Tensor | None = None) -> Tensor:
    return ops.linear(H, W_U, None)


def _next_token_log_softmax(logits: Tensor) -> Tensor:
    acc = ops.accumulation_dtype(logits.dtype)
    return torch.log_softmax(logits.to(acc), dim=-1).to(logits.dtype)


def _log_probability_not_shifted(tokens: Tensor, logits: Tensor) -> Tensor:
    # row t scored against x_t instead of x_{t+1}
    log_p = torch.log_softmax(logits[..., 1:, :].to(ops.accumulation_dtype(logits.dtype)), dim=-1)
    return log_p.gather(-1, tokens[..., 1:].long().unsqueeze(-1)).squeeze(-1).sum(dim=-1)


# --- the generation bugs ------------------------------------------------------------------


def _top_k_off_by_one(z: Tensor, k: int) -> Tensor:
    k = min(int(k) + 1, z.shape[-1])  # keeps the k + 1 largest
    kth = torch.topk(z, k, dim=-1).values[..., -1:]
    return z.masked_fill(z < kth, float("-inf"))


def _nucleus_without_crossing_token(z: Tensor, p: float) -> Tensor:
    if p >= 1:
        return z
    probs = torch.softmax(z, dim=-1)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    cum = torch.cumsum(sorted_probs, dim=-1)
    # kept iff the mass *including* it is < p: the token that crosses p is dropped
    # (the first token is always kept, so the distribution stays defined)
    inside = (cum < p) | (torch.arange(cum.shape[-1], device=cum.device) == 0)
    keep = torch.zeros_like(inside).scatter(-1, order, inside)
    return z.masked_fill(~keep, float("-inf"))


def _sampling_temperature_multiplies(logits: Tensor, temperature: float = 1.0,
                                     top_k: int | None = None,
                                     top_p: float | None = None) -> Tensor:
    if temperature == 0:
        return _ORIGINAL_SAMPLING(logits, 0, top_k, top_p)
    # z·τ instead of z/τ (the correct function, given z·τ², divides by τ)
    return _ORIGINAL_SAMPLING(logits * temperature ** 2, temperature, top_k, top_p)


def _stale_cache_position(self: Any, T_new: int, lengths: Any = None) -> Any:
    import dataclasses

    step = _ORIGINAL_PLAN(self, T_new, lengths)
    positions = step.positions
    if positions is None:  # the plan of one length: start, start + 1, … for every sequence
        positions = self.lengths[:, None] + torch.arange(T_new, device=self.device)
    # the new tokens' positions read before the lengths were advanced: one step behind
    return dataclasses.replace(step, positions=(positions - 1).clamp(min=0))


def _prepacked_product_without_bias(self: Any, x: Tensor, bias: Tensor | None) -> Tensor:
    return _ORIGINAL_PACKED_PRODUCT(self, x, None)  # as if every layer had no bias


def _decode_step_misses_own_key(self: Any, layer: int, K: Tensor, V: Tensor,
                                plan: Any) -> Any:
    k, v = _ORIGINAL_WRITE(self, layer, K, V, plan)
    if K.shape[-2] != 1 or plan.rows is not None:  # only the common decoding step
        return k, v
    # the slots before the new token's: it attends to everything but itself (the first
    # token of all has nothing else, so it keeps its own slot there)
    n = max(k.shape[-2] - 1, 1)
    return k[:, :, :n], v[:, :, :n]


def _gemv_without_last_column_pair(self: Any, x: Tensor, bias: Tensor | None) -> Tensor:
    # a kernel whose loop stops one column pair short
    x = x.clone()
    x[..., -2:] = 0
    return _ORIGINAL_GEMV(self, x, bias)


def _plan_positions_from_padded_length(self: Any, T_new: int, lengths: Any = None) -> Any:
    import dataclasses

    step = _ORIGINAL_PLAN(self, T_new, lengths)
    if step.rows is None:
        return step
    # every row's new tokens placed after the longest row (as if counted from the start of
    # a batch padded to one length): a shorter row's tokens get later positions
    offsets = torch.arange(T_new, device=self.device)
    positions = (self.lengths.max() + offsets).expand_as(step.positions)
    return dataclasses.replace(step, positions=positions.clamp(max=self.config.n_ctx - 1))


def _plan_attends_padding(self: Any, T_new: int, lengths: Any = None) -> Any:
    import dataclasses

    step = _ORIGINAL_PLAN(self, T_new, lengths)
    if step.rows is None or T_new != 1:
        return step
    # a one-token step sees every slot written so far: a shorter row also attends to the
    # padding its prompt was filled up with
    return dataclasses.replace(step, mask=torch.ones_like(step.mask))


def _plan_at_longest(self: Any, T_new: int, lengths: Any = None) -> Any:
    if lengths is None and self.uniform_length is None:
        # the batch's longest length stands in for every row's once the rows differ: the
        # plan of one length (slice writes, no mask) at that length
        self.uniform_length = self._bound
    return _ORIGINAL_PLAN(self, T_new, lengths)


def _originals() -> tuple[Any, Any, Any, Any, Any]:
    from gptspec.fast import sampling
    from gptspec.fast.bf16_gemv import BlockedWeight
    from gptspec.fast.kv_cache import KVCache
    from gptspec.fast.prepacked import PackedMatrix

    return (sampling.sampling_distribution, KVCache.plan, PackedMatrix.__call__, KVCache.write,
            BlockedWeight.__call__)


(_ORIGINAL_SAMPLING, _ORIGINAL_PLAN, _ORIGINAL_PACKED_PRODUCT, _ORIGINAL_WRITE,
 _ORIGINAL_GEMV) = _originals()


# --- the tokenizer bugs ---------------------------------------------------------------------


class _FrequencyTokenizer(Tokenizer):
    """Merges the pair that occurs most often in the chunk first, not the lowest rank."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._encoding = None  # no tiktoken: every chunk goes through _bpe_chunk below

    def _bpe_chunk(self, chunk: str) -> tuple[int, ...]:
        ids = list(chunk.encode("utf-8"))
        while len(ids) > 1:
            counts = Counter(p for p in zip(ids, ids[1:], strict=False) if p in self._rank)
            if not counts:
                break
            pair = max(counts, key=lambda p: (counts[p], -self._rank[p]))
            ids = ref_tok.merge_pair(ids, pair, 256 + self._rank[pair])
        return tuple(ids)


class _LeftmostTokenizer(_FrequencyTokenizer):
    """Merges the leftmost mergeable pair first, whatever its rank."""

    def _bpe_chunk(self, chunk: str) -> tuple[int, ...]:
        ids = list(chunk.encode("utf-8"))
        while True:
            hit = next((j for j, p in enumerate(zip(ids, ids[1:], strict=False))
                        if p in self._rank), None)
            if hit is None:
                return tuple(ids)
            ids[hit:hit + 2] = [256 + self._rank[(ids[hit], ids[hit + 1])]]


class _SpecialAlwaysAllowed(Tokenizer):
    """Encodes a special token's text as its id even when it is not allowed."""

    def encode(self, text: str, allowed_special: Any = ()) -> list[int]:
        return super().encode(text, allowed_special="all")


class _DecodeWraps(Tokenizer):
    """Decodes an out-of-range id modulo the vocabulary instead of refusing it."""

    def decode(self, ids: Any) -> str:
        return super().decode([i % self._n_bpe if i >= self.vocab_size or i < 0 else i
                               for i in ids])


# GPT-2's pattern with one alternative changed, as a backend author might write it
_GPT2_CASE_INSENSITIVE = ref_tok.GPT2_PATTERN.replace("'s|'t|'re|'ve|'m|'ll|'d",
                                                      "(?i:'s|'t|'re|'ve|'m|'ll|'d)", 1)
_GPT2_DIGITS_BY_THREE = ref_tok.GPT2_PATTERN.replace(r" ?\p{N}+", r" ?\p{N}{1,3}", 1)


class _PatternSlip(Tokenizer):
    """Encodes with ``SLIP`` where GPT-2's pattern is configured (chunk by chunk, no
    tiktoken)."""

    SLIP = ref_tok.GPT2_PATTERN

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.pattern == ref_tok.GPT2_PATTERN:
            self._encoding = None
            self._compiled = regex.compile(self.SLIP)


class _ContractionsAnyCase(_PatternSlip):
    SLIP = _GPT2_CASE_INSENSITIVE


class _DigitsByThree(_PatternSlip):
    SLIP = _GPT2_DIGITS_BY_THREE


class _WhitespaceCutAsciiOnly(Tokenizer):
    """GPT-2's lookahead-free form, with the whitespace runs cut where only ASCII white
    space counts as white space (Unicode's other spaces are never cut before)."""

    def _encode_tiktoken(self, text: str) -> list[int]:
        if not self._cut_runs:
            return super()._encode_tiktoken(text)
        assert self._encoding is not None
        space = [c in " \t\n\r\x0b\x0c" for c in text]
        cuts = [i for i in range(1, len(text) - 1)
                if space[i - 1] and space[i] and not space[i + 1]]
        ids: list[int] = []
        for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True):
            ids += self._encoding.encode_ordinary(text[a:b])
        return ids


class _LookaheadDropped(Tokenizer):
    """GPT-2's pattern run in its lookahead-free form (\\s+ for \\s+(?!\\S)) without
    cutting the whitespace runs first."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._cut_runs = False


class _DecodeIgnoresInvalid(Tokenizer):
    def decode(self, ids: Any) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="ignore")


def _one_replacement_per_byte(err: UnicodeError) -> tuple[str, int]:
    assert isinstance(err, UnicodeDecodeError)
    return "\ufffd" * (err.end - err.start), err.end


codecs.register_error("gptspec-mutant-per-byte", _one_replacement_per_byte)


class _DecodeReplacesEachByte(Tokenizer):
    def decode(self, ids: Any) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="gptspec-mutant-per-byte")


class _TokenizerMutant(FastTokenizerBackend):
    def __init__(self, name: str, tokenizer: type[Tokenizer] = Tokenizer,
                 ties_to_largest: bool = False) -> None:
        self.name = f"fast+{name}"
        self.tokenizer = tokenizer
        self.ties_to_largest = ties_to_largest

    def train(self, text: str, vocab_size: int, pattern: str) -> list[tuple[int, int]]:
        if not self.ties_to_largest:
            return super().train(text, vocab_size, pattern)
        chunks = Counter(tuple(c.encode("utf-8")) for c in ref_tok.pretokenize(text, pattern))
        merges: list[tuple[int, int]] = []
        for k in range(vocab_size - 256):
            counts = {p: c for p, c in ref_tok.pair_counts(chunks).items() if c > 0}
            if not counts:
                break
            pair = max(counts, key=lambda p: (counts[p], p))  # ties to the largest pair
            merges.append(pair)
            merged: Counter[tuple[int, ...]] = Counter()
            for w, mult in chunks.items():
                merged[tuple(ref_tok.merge_pair(w, pair, 256 + k))] += mult
            chunks = merged
        return merges

    def build(self, merges: Sequence[tuple[int, int]], pattern: str,
              special_tokens: Mapping[str, int]) -> Tokenizer:
        return self.tokenizer(merges, pattern, special_tokens)


# --- training mutants -------------------------------------------------------------------------


def _unembed_from_detached_embedding(H: Tensor, W_E: Tensor) -> Tensor:
    """The tied output map reads a detached W_E: its gradient never reaches W_E."""
    return F.linear(H, W_E.detach())


def _adam_trajectory(params: dict, grads: list, lrs: list, beta1: float, beta2: float,
                     eps: float, weight_decay: float, *, decoupled: bool, corrected: bool,
                     dtype: torch.dtype) -> list:
    """Adam steps written out, with the decay coupled or decoupled and the bias
    correction on or off (both on is AdamW)."""
    theta = {k: torch.tensor(v, dtype=dtype) for k, v in params.items()}
    m = {k: torch.zeros_like(t) for k, t in theta.items()}
    v = {k: torch.zeros_like(t) for k, t in theta.items()}
    out = []
    for step, (g_step, lr) in enumerate(zip(grads, lrs, strict=True), start=1):
        for k, t in theta.items():
            g = torch.tensor(g_step[k], dtype=dtype)
            if not decoupled:
                g = g + weight_decay * t  # L2: the decay goes through the moments
            m[k] = beta1 * m[k] + (1 - beta1) * g
            v[k] = beta2 * v[k] + (1 - beta2) * g * g
            m_hat = m[k] / (1 - beta1**step) if corrected else m[k]
            v_hat = v[k] / (1 - beta2**step) if corrected else v[k]
            decay = lr * weight_decay * t if decoupled else 0.0
            theta[k] = t - lr * m_hat / (v_hat.sqrt() + eps) - decay
        out.append({k: t.double().numpy().copy() for k, t in theta.items()})
    return out


class _AdamMutant(TorchBackend):
    def __init__(self, name: str, decoupled: bool, corrected: bool) -> None:
        super().__init__("cpu", "float32")
        self.name = f"torch+{name}"
        self._decoupled, self._corrected = decoupled, corrected

    def adamw_trajectory(self, params, grads, lrs, beta1, beta2, eps, weight_decay):  # type: ignore[override]
        return _adam_trajectory(dict(params), grads, lrs, beta1, beta2, eps, weight_decay,
                                decoupled=self._decoupled, corrected=self._corrected,
                                dtype=self.torch_dtype)


# --- trainer-loop mutants (gptspec.fast.train: the loop gptspec train runs) -------------------


def _lr_at_one_based_step(self: Any, step: int) -> float:
    """The schedule read at the 1-based step count: every step takes the next step's rate
    (the warm-up's first step is skipped)."""
    from gptspec.reference.optimizer import lr_schedule

    decay = self.decay_steps or self.max_steps
    return lr_schedule(step + 1, self.lr, self.min_lr, min(self.warmup_steps, decay),
                       max(decay, self.warmup_steps + 1))


def _lr_cosine_over_max_steps(self: Any, step: int) -> float:
    """The cosine's horizon taken as max_steps, ignoring decay_steps."""
    from gptspec.reference.optimizer import lr_schedule

    return lr_schedule(step, self.lr, self.min_lr, min(self.warmup_steps, self.max_steps),
                       max(self.max_steps, self.warmup_steps + 1))


def _optimizer_decaying_everything(model: Any, settings: Any) -> Any:
    """One parameter group: biases and LayerNorm gains decayed like the matrices."""
    from gptspec.fast.optimizer import AdamW

    return AdamW([{"params": model.parameters(), "weight_decay": settings.weight_decay}],
                 lr=settings.lr, betas=(settings.beta1, settings.beta2), eps=settings.eps)


def _mutant_step_on(*, sum_micro_batches: bool = False, clip_each_micro_batch: bool = False,
                    lr_first_group_only: bool = False, clip_after_step: bool = False
                    ) -> Callable[..., float]:
    """Trainer.step_on (CPU, one process) with one ordering or accumulation bug."""

    def step_on(self: Any, batches: list) -> float:
        s = self.settings
        lr = s.learning_rate(self.step_count)
        groups = self.optimizer.param_groups[:1] if lr_first_group_only else \
            self.optimizer.param_groups
        for group in groups:
            group["lr"] = lr
        total = 0.0
        for x, y in batches:
            loss = self.loss(x, y) if sum_micro_batches else self.loss(x, y) / len(batches)
            loss.backward()
            total += float(loss.detach())
            if clip_each_micro_batch and s.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), s.grad_clip)
        if s.grad_clip > 0 and not (clip_each_micro_batch or clip_after_step):
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), s.grad_clip)
        self.optimizer.step()
        if clip_after_step and s.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), s.grad_clip)
        self.optimizer.zero_grad(set_to_none=True)
        self.step_count += 1
        return total

    return step_on


# --- the catalog ----------------------------------------------------------------------------


class _TorchWithTokenizer(TorchBackend):
    """The built-in backend bringing a mutant tokenizer (the suite's tokenizer area)."""

    def __init__(self, tokenizer_backend: Any) -> None:
        super().__init__("cpu", "float32")
        self._tokenizer_backend = tokenizer_backend
        self.name = f"torch+{tokenizer_backend.name}"

    def tokenizer(self) -> Any:  # type: ignore[override]
        return self._tokenizer_backend


# --- bugs that only real sizes show ------------------------------------------------------
# Kernels take other paths past their tile and block sizes; each bug below lives on such a
# path, so toy shapes (≤ 64 keys, d_k ≤ 64, vocabularies < 2¹⁶) never reach it.

KEY_TILE = 64
SOFTMAX_BLOCK = 64
WIDEST_TUNED_HEAD = 64
_ORIGINAL_UNEMBED_TIED = ops.unembed_tied


def _attention_mask_for(Q: Tensor, K: Tensor, M: Tensor | None, is_causal: bool) -> Tensor:
    """The additive float mask SDPA applies (M, or the causal one, or none)."""
    Tq, Tk = Q.shape[-2], K.shape[-2]
    if M is not None:
        if M.dtype == torch.bool:
            return torch.zeros(M.shape, dtype=Q.dtype, device=Q.device).masked_fill(~M, -math.inf)
        return M.to(Q.dtype)
    if is_causal:
        return torch.full((Tq, Tk), -math.inf, dtype=Q.dtype, device=Q.device).triu(1)
    return torch.zeros((Tq, Tk), dtype=Q.dtype, device=Q.device)


def _sdpa_drops_partial_key_tile(Q: Tensor, K: Tensor, V: Tensor, M: Tensor | None = None, *,
                                 is_causal: bool = False) -> Tensor:
    # keys in tiles of 64; past the first tile, the last partial tile is never loaded
    Tk = K.shape[-2]
    if Tk <= KEY_TILE or Tk % KEY_TILE == 0:
        return F.scaled_dot_product_attention(Q, K, V, attn_mask=M, is_causal=is_causal)
    mask = _attention_mask_for(Q, K, M, is_causal).clone()
    mask[..., Tk // KEY_TILE * KEY_TILE:] = -math.inf
    return F.scaled_dot_product_attention(Q, K, V, attn_mask=mask)


def _sdpa_scale_capped_at_64(Q: Tensor, K: Tensor, V: Tensor, M: Tensor | None = None, *,
                             is_causal: bool = False) -> Tensor:
    # a kernel tuned for d_k ≤ 64 keeps its 1/√64 for wider heads
    scale = 1 / math.sqrt(min(Q.shape[-1], WIDEST_TUNED_HEAD))
    return F.scaled_dot_product_attention(Q, K, V, attn_mask=M, is_causal=is_causal,
                                          scale=scale)


def _softmax_online_max_not_rescaled(z: Tensor, axis: int = -1) -> Tensor:
    # online softmax over blocks of 64: the running sum is not rescaled when a later
    # block raises the running maximum
    acc = ops.accumulation_dtype(z.dtype)
    x = z.to(acc).movedim(axis, -1)
    if x.shape[-1] <= SOFTMAX_BLOCK:
        return torch.softmax(z, dim=axis, dtype=acc).to(z.dtype)
    running_max = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=acc, device=x.device)
    total = torch.zeros_like(running_max)
    for block in x.split(SOFTMAX_BLOCK, dim=-1):
        running_max = torch.maximum(running_max, block.max(dim=-1, keepdim=True).values)
        total = total + torch.exp(block - running_max).sum(dim=-1, keepdim=True)
    return (torch.exp(x - running_max) / total).movedim(-1, axis).to(z.dtype)


def _token_embedding_ids_as_uint16(tokens: Tensor, W_E: Tensor) -> Tensor:
    return F.embedding(tokens % 2**16, W_E)  # ids stored in 16 bits wrap past 65535


def _layer_norm_in_one_16_bit_call(x: Tensor, gamma: Tensor, beta: Tensor,
                                   eps: float) -> Tensor:
    # PyTorch 2.13's CPU LayerNorm on 16-bit tensors: the right forward value, but its
    # backward sums ∂γ and ∂β over the rows with 16-bit partial sums
    return F.layer_norm(x, (x.shape[-1],), gamma, beta, eps)


def _token_embedding_by_16_bit_rows(tokens: Tensor, W_E: Tensor) -> Tensor:
    # PyTorch 2.13's CPU F.embedding: its backward adds a repeated token's rows of ∂E into
    # ∂W_E one at a time in the 16-bit dtype
    return F.embedding(tokens, W_E)


def _unembed_tied_drops_partial_vocab_tile(H: Tensor, W_E: Tensor) -> Tensor:
    # the vocabulary in tiles of 64 columns; the last partial tile is never written
    logits = _ORIGINAL_UNEMBED_TIED(H, W_E)
    V = W_E.shape[0]
    if V > KEY_TILE and V % KEY_TILE:
        logits = logits.clone()
        logits[..., V // KEY_TILE * KEY_TILE:] = 0
    return logits


def _decode_step_drops_partial_key_tile(self: Any, layer: int, K: Tensor, V: Tensor,
                                        plan: Any) -> Any:
    # the decoding step reads the cache in tiles of 64 slots; past the first tile, the
    # last partial tile (the newest keys, the token's own among them) is never loaded
    k, v = _ORIGINAL_WRITE(self, layer, K, V, plan)
    if K.shape[-2] != 1 or plan.rows is not None:  # only the common decoding step
        return k, v
    n = k.shape[-2]
    if n > KEY_TILE and n % KEY_TILE:
        n -= n % KEY_TILE
    return k[:, :, :n], v[:, :, :n]


def _scores_scaled_after_the_product(Q: Tensor, K: Tensor, M: Tensor) -> Tensor:
    # Q Kᵀ formed in the dtype, then scaled: past the dtype's largest value it is ∞ (and
    # ∞ − ∞ = NaN under the mask) where the scaled scores are finite
    return Q @ K.transpose(-1, -2) / math.sqrt(Q.shape[-1]) + M


def _onednn_bf16() -> bool:
    from gptspec.fast import prepacked

    return prepacked.supported("cpu", torch.bfloat16)


def _bf16_gemv_built() -> bool:
    from gptspec.fast import bf16_gemv

    return _onednn_bf16() and bf16_gemv.available()


def _fwd(name: str, breaks: str | tuple[str, ...], doc: str, **patches: Callable[..., Any]
         ) -> Mutant:
    return Mutant(name, (breaks,) if isinstance(breaks, str) else breaks, "forward", doc,
                  patches)


def _tok(name: str, breaks: tuple[str, ...], doc: str, **kwargs: Any) -> Mutant:
    return Mutant(name, breaks, "tokenizer", doc,
                  make_backend=lambda: _TorchWithTokenizer(_TokenizerMutant(name, **kwargs)))


def _train(name: str, breaks: tuple[str, ...], doc: str, **kwargs: Any) -> Mutant:
    return Mutant(name, breaks, "training", doc, **kwargs)


def _gen(name: str, breaks: tuple[str, ...], doc: str, **elsewhere: Callable[..., Any]
         ) -> Mutant:
    return Mutant(name, breaks, "generation", doc,
                  elsewhere={k.replace("__", "."): v for k, v in elsewhere.items()})


MUTANTS: tuple[Mutant, ...] = (
    _fwd("mask_shifted_by_one", "causal_mask",
         "The causal mask lets position i see i + 1 (triu(2) for triu(1)).",
         causal_mask=_mask_shifted_by_one),
    _fwd("mask_hides_diagonal", "causal_mask",
         "The causal mask also hides the diagonal: no token attends to itself.",
         causal_mask=_mask_hides_diagonal),
    _fwd("scores_unscaled", "attention_scores",
         "Q Kᵀ without the 1/√d_k factor.", attention_scores=_scores_unscaled),
    _fwd("scores_scaled_by_dk", "attention_scores",
         "Q Kᵀ divided by d_k: the factor squared.", attention_scores=_scores_scaled_by_dk),
    _fwd("sdpa_unscaled", "scaled_dot_product_attention",
         "The fused attention kernel called with scale=1 (1/√d_k missing on the model path).",
         scaled_dot_product_attention=_sdpa_unscaled),
    _fwd("softmax_wrong_axis", "softmax",
         "softmax normalises over the rows' axis instead of the last one.",
         softmax=_softmax_wrong_axis),
    _fwd("softmax_without_max_shift", "softmax",
         "exp(z)/Σexp(z) without subtracting max z: overflows to NaN for large scores.",
         softmax=_softmax_without_max_shift),
    _fwd("attention_masked_after_softmax", "attention_weights",
         "The mask applied by zeroing after the softmax: rows no longer sum to one.",
         attention_weights=_attention_weights_masked_after_softmax),
    _fwd("layer_norm_unbiased_variance", "layer_norm",
         "LayerNorm with the Bessel-corrected variance (divides by n − 1).",
         layer_norm=_layer_norm_unbiased),
    _fwd("layer_norm_eps_outside_root", "layer_norm",
         "LayerNorm divides by √σ² + ε instead of √(σ² + ε).",
         layer_norm=_layer_norm_eps_outside_root),
    _fwd("final_layer_norm_skipped", "final_layer_norm",
         "The final LayerNorm is configured but not applied.",
         final_layer_norm=_final_layer_norm_skipped),
    _fwd("heads_split_without_transpose", ("split_heads", "merge_heads"),
         "(T, d) reshaped straight to (h, T, d_k): heads mix positions and features.",
         split_heads=_split_heads_without_transpose),
    _fwd("heads_merged_without_transpose", ("split_heads", "merge_heads"),
         "(h, T, d_k) reshaped straight to (T, d): merge is not split's inverse.",
         merge_heads=_merge_heads_without_transpose),
    _fwd("w_o_skipped", "multi_head_attention",
         "The concatenated heads are returned without the output projection W_O.",
         multi_head_attention=_mha_without_w_o),
    _fwd("head_sum_w_o_by_columns", "multi_head_attention_head_sum",
         "W_O⁽ⁱ⁾ cut from the columns of W_O instead of its rows.",
         multi_head_attention_head_sum=_head_sum_w_o_by_columns),
    _fwd("qkv_k_v_swapped", "qkv_projection",
         "The fused projection's K and V column blocks are swapped.",
         qkv_projection=_qkv_k_v_swapped),
    _fwd("linear_bias_dropped", "linear",
         "x W without + b.", linear=_linear_bias_dropped),
    _fwd("exact_gelu_where_tanh_configured", "gelu_tanh",
         "gelu_tanh computes the exact erf GELU.", gelu_tanh=_gelu_tanh_is_exact),
    _fwd("tanh_gelu_where_exact_configured", "gelu",
         "gelu computes the tanh approximation.", gelu=_gelu_is_tanh),
    _fwd("relu_leaky", "relu",
         "ReLU with a 0.01 negative slope.", relu=_relu_leaky),
    _fwd("ffn_gelu_uses_tanh", "ffn_gelu",
         "The GELU feed-forward network built with the tanh approximation.",
         ffn_gelu=_ffn_gelu_with_tanh),
    _fwd("ffn_relu_without_b2", "ffn_relu",
         "The ReLU FFN drops its second bias b_2.", ffn_relu=_ffn_relu_without_b2),
    _fwd("guide_product_summed", "ffn_guide_product",
         "The Guide's FFNN adds the two branches instead of multiplying them.",
         ffn_guide_product=_guide_product_summed),
    _fwd("pre_ln_residual_from_input", "block_pre_ln",
         "Pre-LN block: the FFN's residual taken from the block input instead of H'.",
         residual_pre_ln=_pre_ln_second_residual_from_input),
    _fwd("post_ln_computed_as_pre_ln", "block_post_ln",
         "The post-LN block normalises before each sublayer (pre-LN) instead of after.",
         residual_post_ln=_post_ln_normalises_first),
    _fwd("guide_block_without_residual", "block_guide",
         "The Guide's block drops its residual connection.",
         residual_guide=_guide_without_residual),
    _fwd("positions_off_by_one", ("positional_embedding", "gpt_forward"),
         "Position t gets the embedding of t + 1.", positional_embedding=_positions_off_by_one),
    _fwd("token_embedding_off_by_one", "token_embedding",
         "Token x gets row x + 1 of W_E.", token_embedding=_token_embedding_off_by_one),
    _fwd("token_embedding_scaled_by_sqrt_d", "input_representation",
         "e·√d_model + p, Vaswani's scaling, which this model does not have.",
         input_representation=_embeddings_scaled),
    _fwd("unembed_bias_dropped", "unembed_untied",
         "The untied output projection drops b_U.", unembed_untied=_unembed_untied_without_bias),
    _fwd("next_token_log_probabilities", "next_token_distribution",
         "The next-token distribution returned as log-probabilities.",
         next_token_distribution=_next_token_log_softmax),
    _fwd("log_probability_not_shifted", "sequence_log_probability",
         "log P(x) scores row t against x_t instead of x_{t+1}.",
         sequence_log_probability=_log_probability_not_shifted),
    _gen("top_k_off_by_one", ("top_k_filter",),
         "top-k keeps the k + 1 largest logits.",
         gptspec__fast__sampling__top_k_filter=_top_k_off_by_one),
    _gen("nucleus_without_crossing_token", ("nucleus_filter",),
         "The nucleus drops the token whose probability carries the mass past p.",
         gptspec__fast__sampling__nucleus_filter=_nucleus_without_crossing_token),
    _gen("temperature_multiplies", ("temperature_softmax",),
         "The logits multiplied by the temperature instead of divided by it.",
         gptspec__fast__sampling__sampling_distribution=_sampling_temperature_multiplies),
    _gen("stale_kv_cache_position", ("kv_cache_attention", "generate"),
         "A cached step embeds its new token at the previous position (stale length).",
         gptspec__fast__kv_cache__KVCache__plan=_stale_cache_position),
    Mutant("prepacked_product_drops_bias", ("linear", "generate"), "generation",
           "Generation's prepacked 16-bit product (the bfloat16 CPU path) drops the bias b.",
           elsewhere={"gptspec.fast.prepacked.PackedMatrix.__call__":
                      _prepacked_product_without_bias}, dtype="bfloat16",
           requires=("oneDNN's bfloat16 product (a CPU with AVX-512)", _onednn_bf16)),
    _gen("decode_step_misses_its_own_key", ("kv_cache_attention", "generate"),
         "The decoding step's new token attends to the cached tokens but not to itself.",
         gptspec__fast__kv_cache__KVCache__write=_decode_step_misses_own_key),
    Mutant("bf16_gemv_stops_a_column_pair_short", ("linear", "generate"), "generation",
           "The batch-1 bfloat16 GEMV kernel skips the last two columns of x (and of A).",
           elsewhere={"gptspec.fast.bf16_gemv.BlockedWeight.__call__":
                      _gemv_without_last_column_pair}, dtype="bfloat16",
           requires=("AVX-512 BF16 (the GEMV kernel's instructions)", _bf16_gemv_built)),
    _gen("decode_step_drops_partial_key_tile", ("kv_cache_attention", "generate"),
         "The decoding step reads the cache in tiles of 64 slots and, past the first tile, "
         "never loads the last partial one (only contexts past 64 tokens).",
         gptspec__fast__kv_cache__KVCache__write=_decode_step_drops_partial_key_tile),
    _gen("ragged_positions_from_padded_length", ("kv_cache_attention", "generate"),
         "Once a batch's sequences differ in length, every new token takes the position "
         "after the longest one (counted from the padded start).",
         gptspec__fast__kv_cache__KVCache__plan=_plan_positions_from_padded_length),
    _gen("ragged_cache_attends_padding", ("kv_cache_attention", "generate"),
         "A one-token step of a ragged batch attends to every cached slot, the padding "
         "of the shorter prompts included.",
         gptspec__fast__kv_cache__KVCache__plan=_plan_attends_padding),
    _gen("ragged_decode_step_at_longest_length", ("kv_cache_attention", "generate"),
         "The cache takes the longest length for everyone's once the rows differ: the "
         "decoding step writes and places every row's token there, seeing every slot.",
         gptspec__fast__kv_cache__KVCache__plan=_plan_at_longest),
    _train("tied_gradient_from_one_use", ("tied_embedding_accumulation",),
           "The tied W_E gets the gradient of its embedding use only; the unembedding's "
           "contribution H_fᵀ G_Z is dropped.",
           patches={"unembed_tied": _unembed_from_detached_embedding}),
    _train("l2_instead_of_decoupled_decay", ("adamw_step",),
           "Weight decay added to the gradient (Adam with L2) instead of decoupled from it.",
           make_backend=lambda: _AdamMutant("l2_decay", decoupled=False, corrected=True)),
    _train("adamw_without_bias_correction", ("adamw_step",),
           "The moments used without dividing by 1 − β₁ᵗ and 1 − β₂ᵗ.",
           make_backend=lambda: _AdamMutant("no_bias_correction", decoupled=True,
                                            corrected=False)),
    _train("accumulation_sums_micro_batches", ("train_loop",),
           "The trainer sums the micro-batches' losses (and gradients) instead of averaging.",
           elsewhere={"gptspec.fast.train.Trainer.step_on":
                      _mutant_step_on(sum_micro_batches=True)}),
    _train("clip_before_accumulation_completes", ("train_loop", "clip_grad_norm"),
           "The trainer clips the accumulated gradient after every micro-batch, not once.",
           elsewhere={"gptspec.fast.train.Trainer.step_on":
                      _mutant_step_on(clip_each_micro_batch=True)}),
    _train("clip_after_optimizer_step", ("train_loop", "clip_grad_norm"),
           "The trainer clips the gradient after AdamW has used it (clipping has no effect).",
           elsewhere={"gptspec.fast.train.Trainer.step_on":
                      _mutant_step_on(clip_after_step=True)}),
    _train("lr_set_in_first_group_only", ("train_loop", "lr_schedule"),
           "The schedule's rate is written into the decayed group only; biases and gains "
           "keep the initial rate.",
           elsewhere={"gptspec.fast.train.Trainer.step_on":
                      _mutant_step_on(lr_first_group_only=True)}),
    _train("warmup_off_by_one", ("train_loop", "lr_schedule"),
           "The schedule is read at the 1-based step: each step takes the next step's rate.",
           elsewhere={"gptspec.fast.train.TrainSettings.learning_rate": _lr_at_one_based_step}),
    _train("cosine_horizon_ignores_decay_steps", ("train_loop", "lr_schedule"),
           "The cosine decays over max_steps whatever decay_steps says.",
           elsewhere={"gptspec.fast.train.TrainSettings.learning_rate":
                      _lr_cosine_over_max_steps}),
    _train("weight_decay_on_biases_and_gains", ("train_loop",),
           "One parameter group: biases and LayerNorm gains are decayed like the matrices.",
           elsewhere={"gptspec.fast.train.make_optimizer": _optimizer_decaying_everything}),
    Mutant("layer_norm_gradient_summed_in_16_bit", ("layer_norm_backward", "gpt_backward"),
           "training", "LayerNorm's ∂γ and ∂β summed over the B·T rows in bfloat16 "
           "(PyTorch 2.13's own CPU kernel, which the built-in backend once called): "
           "hundreds of roundings off over a long batch.",
           {"layer_norm": _layer_norm_in_one_16_bit_call}, dtype="bfloat16"),
    Mutant("embedding_gradient_summed_in_16_bit", ("token_embedding_backward", "gpt_backward"),
           "training", "A repeated token's rows of ∂E added into ∂W_E one at a time in "
           "bfloat16 (PyTorch 2.13's CPU F.embedding backward): a token seen hundreds of "
           "times in a batch gets a gradient far more than one rounding off.",
           {"token_embedding": _token_embedding_by_16_bit_rows}, dtype="bfloat16"),
    _tok("bpe_merges_by_frequency", ("bpe_chunk",),
         "Encoding merges the most frequent pair in the chunk first instead of the lowest "
         "rank.", tokenizer=_FrequencyTokenizer),
    _tok("bpe_merges_leftmost_first", ("bpe_chunk",),
         "Encoding merges the leftmost mergeable pair first instead of the lowest rank.",
         tokenizer=_LeftmostTokenizer),
    _tok("train_ties_to_largest_pair", ("best_pair", "train"),
         "Training breaks count ties toward the largest pair instead of the smallest.",
         ties_to_largest=True),
    _tok("special_tokens_always_allowed", ("split_special",),
         "A special token's text is encoded as its id even where it is not allowed.",
         tokenizer=_SpecialAlwaysAllowed),
    _tok("contractions_case_insensitive", ("pretokenize",),
         "GPT-2's pattern matches its contractions in any case ('S, 'LL as one chunk).",
         tokenizer=_ContractionsAnyCase),
    _tok("digits_grouped_by_three", ("pretokenize",),
         "GPT-2's pattern cuts digit runs into groups of three (the cl100k-style rule).",
         tokenizer=_DigitsByThree),
    _tok("whitespace_cut_ascii_only", ("pretokenize",),
         "The lookahead-free GPT-2 pattern's cut before a whitespace run's last character "
         "knows only ASCII white space (U+3000, U+00A0, … runs stay whole).",
         tokenizer=_WhitespaceCutAsciiOnly),
    _tok("whitespace_lookahead_dropped", ("pretokenize",),
         "GPT-2's \\s+(?!\\S) run as \\s+ without the cut: a space run keeps its last "
         "space from the word after it.", tokenizer=_LookaheadDropped),
    _tok("decode_ignores_invalid_bytes", ("decode",),
         "decode drops ill-formed UTF-8 (errors='ignore') instead of replacing it.",
         tokenizer=_DecodeIgnoresInvalid),
    _tok("decode_replaces_each_invalid_byte", ("decode",),
         "decode puts one U+FFFD per ill-formed byte, not per maximal subpart.",
         tokenizer=_DecodeReplacesEachByte),
    _tok("decode_wraps_out_of_range", ("decode",),
         "decode maps an id outside the vocabulary modulo its size instead of refusing it.",
         tokenizer=_DecodeWraps),
    _fwd("sdpa_drops_partial_key_tile", "scaled_dot_product_attention",
         "Attention over keys in tiles of 64 never loads the last partial tile (only "
         "past 64 keys).", scaled_dot_product_attention=_sdpa_drops_partial_key_tile),
    Mutant("scores_overflow_before_scaling", ("attention_scores",), "forward",
           "Q Kᵀ rounded to float16 before 1/√d_k: scores near float16's overflow edge "
           "become ∞ (NaN under the mask) although the scaled scores are finite.",
           {"attention_scores": _scores_scaled_after_the_product}, dtype="float16"),
    _fwd("sdpa_scale_capped_at_64", "scaled_dot_product_attention",
         "Attention scaled by 1/√64 for every head wider than 64 (a kernel tuned up to "
         "d_k = 64).", scaled_dot_product_attention=_sdpa_scale_capped_at_64),
    _fwd("online_softmax_max_not_rescaled", "softmax",
         "Online softmax over blocks of 64: the running sum is not rescaled when a later "
         "block raises the maximum.", softmax=_softmax_online_max_not_rescaled),
    _fwd("token_ids_wrap_at_65536", "token_embedding",
         "Token ids held in 16 bits: id 65536 + k embeds as k.",
         token_embedding=_token_embedding_ids_as_uint16),
    _fwd("unembed_drops_partial_vocab_tile", "unembed_tied",
         "The tied unembedding in tiles of 64 vocabulary columns never writes the last "
         "partial tile (vocabularies past 64).",
         unembed_tied=_unembed_tied_drops_partial_vocab_tile),
)

BY_NAME = {m.name: m for m in MUTANTS}
if len(BY_NAME) != len(MUTANTS):
    raise ValueError("duplicate mutant name")

__all__ = ["BY_NAME", "MUTANTS", "Mutant", "MutantTorchBackend", "patched_ops", "patched_paths"]
