"""The PyTorch backend: schema names, agreement with the float64 reference (a smoke check;
the derived-budget suite is conformance/), input checks, the KV cache, dtypes, and the
conformance-protocol wrappers (TorchBackend, ReferenceBackend)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import gptspec.reference as R
from gptspec.conformance import budgets as B
from gptspec.fast import ops
from gptspec.fast.backend import TorchBackend
from gptspec.fast.kv_cache import KVCache
from gptspec.fast.model import GPT, compile_model, resolve_dtype
from gptspec.reference.backend import ReferenceBackend
from gptspec.reference.block import block_parameters
from gptspec.reference.output import gpt_forward
from gptspec.spec import (
    PRESETS,
    GPTConfig,
    ParameterError,
    init_parameters,
    parameter_count,
    parameter_schema,
)

TINY = PRESETS["tiny"]
VARIANTS: dict[str, GPTConfig] = {
    "tiny": TINY,
    "tiny-post": PRESETS["tiny-post"],
    "tiny-guide": PRESETS["tiny-guide"],
    "gelu-nobias-untied": TINY.replace(ffn="gelu", attn_bias=False, ffn_bias=False, tied_embeddings=False),
    "relu-untied-bias-nofinal": TINY.replace(ffn="relu", tied_embeddings=False,
                                             output_bias=True, final_norm=False),
    "post-gelu_tanh-final": PRESETS["tiny-post"].replace(ffn="gelu_tanh", final_norm=True),
    "guide-nobias": PRESETS["tiny-guide"].replace(attn_bias=False, ffn_bias=False),
}

# CUDA paths run where a GPU is present; on a CPU-only machine these tests run on the CPU.
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

UNIT_ROUNDOFF = {torch.float64: 2.0**-53, torch.float32: 2.0**-24,
                 torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def path_length(config: GPTConfig, T: int) -> int:
    """Sum of the reduction lengths a logit passes through: per block the Q/K/V product (d),
    the attention sum (T), the output map (d), LayerNorm (d) and the FFN's second product
    (d_ff); then the final LayerNorm and the unembedding (d each)."""
    d = config.d_model
    return config.n_layers * (3 * d + T + config.d_ff) + 2 * d


def worst_case_budget(config: GPTConfig, T: int, dtype: torch.dtype) -> float:
    """A relative budget (of max |value|) for the float64 operation smoke test (the
    conformance suite has a budget per operation): each length-n reduction errs by at most
    n·u; the errors add along the path, and each of the L blocks' LayerNorms can at most
    double the relative error it receives (unit-variance inputs, gains near one)."""
    return path_length(config, T) * UNIT_ROUNDOFF[dtype] * 2.0**config.n_layers


def dtype_name(dtype: torch.dtype | str) -> str:
    return str(dtype).removeprefix("torch.")


def as_numpy(t: torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(t, np.ndarray):
        return t
    return (t.float() if t.dtype in ops.HALF_DTYPES else t).detach().cpu().numpy()


def reference_and_budget(tokens, params: dict, config: GPTConfig,  # noqa: ANN001
                         dtype: torch.dtype | str) -> tuple[np.ndarray, np.ndarray]:
    """The float64 reference on the parameters rounded to ``dtype``, and the conformance
    suite's derived budget for every logit of the whole model in that dtype."""
    name = dtype_name(dtype)
    rounded = {k: B.round_to(v, name) for k, v in params.items()}
    tokens = np.asarray(tokens)
    want = gpt_forward(tokens, rounded, config)
    return want, B.budget(B.gpt_forward_bound(tokens, rounded, config, B.Precision.of(name)))


def against_reference(got, tokens, params: dict, config: GPTConfig,  # noqa: ANN001
                      dtype: torch.dtype | str) -> B.Comparison:
    want, bound = reference_and_budget(tokens, params, config, dtype)
    return B.compare(as_numpy(got), want, bound)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want)))


def random_parameters(config: GPTConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Schema parameters with every entry random (LayerNorm gains near one, biases nonzero),
    so that every parameter affects the logits."""
    rng = np.random.default_rng(seed)
    params = {}
    for s in parameter_schema(config):
        if s.init == "ones":
            params[s.name] = 1.0 + 0.1 * rng.normal(size=s.shape)
        elif s.init == "zeros":
            params[s.name] = 0.1 * rng.normal(size=s.shape)
        else:
            params[s.name] = rng.normal(0.0, 0.3, size=s.shape)
    return params


def random_tokens(config: GPTConfig, B: int, T: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, config.vocab_size, size=(B, T))


# --- the parameter schema ----------------------------------------------------------------


@pytest.mark.parametrize("name", VARIANTS)
def test_named_parameters_are_the_schema(name: str) -> None:
    config = VARIANTS[name]
    model = GPT(config)
    got = {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert got == {s.name: s.shape for s in parameter_schema(config)}


@pytest.mark.parametrize("name", ["gpt2", "gpt2-xl", "blueprint", "guide"])
def test_large_presets_match_the_schema_on_the_meta_device(name: str) -> None:
    config = PRESETS[name]
    model = GPT(config, device="meta")  # shapes only, nothing allocated
    got = {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert got == {s.name: s.shape for s in parameter_schema(config)}
    assert sum(p.numel() for p in model.parameters()) == parameter_count(config)
    assert model.wte.device.type == "meta"


def test_gpt2_small_has_124m_parameters() -> None:
    # GPT-2 small's published size, with tied embeddings: 124,439,808.
    assert parameter_count(PRESETS["gpt2"]) == 124_439_808


# --- agreement with the float64 reference ---------------------------------------------------


@pytest.mark.parametrize("name", VARIANTS)
def test_float64_forward_equals_the_reference(name: str) -> None:
    config = VARIANTS[name]
    params = random_parameters(config)
    tokens = random_tokens(config, 3, config.n_ctx)
    model = GPT.from_parameters(params, config, dtype="float64")
    result = against_reference(model(torch.as_tensor(tokens)), tokens, params, config, "float64")
    assert result.passed, result.describe()


@pytest.mark.parametrize("vocab_multiple", [1, 48])
@pytest.mark.parametrize("name", VARIANTS)
def test_float64_gradients_equal_the_reference_backward(name: str, vocab_multiple: int) -> None:
    """Training differentiates this model with autograd: its gradient of the mean
    cross-entropy equals the hand-written reference backward, also with the unembedding
    padded (48 does not divide the vocabulary). Budget: the forward's worst case twice
    (the backward pass retraces every reduction of the forward)."""
    config = VARIANTS[name]
    params = random_parameters(config, seed=12)
    tokens = random_tokens(config, 2, config.n_ctx, seed=13)
    targets = random_tokens(config, 2, config.n_ctx, seed=14)
    loss_ref, grads_ref = R.gpt_backward(tokens, targets, params, config)
    model = GPT.from_parameters(params, config, dtype="float64")
    assert config.vocab_size % 48
    model.vocab_multiple = vocab_multiple
    logits = model(torch.as_tensor(tokens))
    loss = F.cross_entropy(logits.flatten(0, 1), torch.as_tensor(targets).flatten())
    loss.backward()
    budget = 2 * worst_case_budget(config, config.n_ctx, torch.float64)
    assert abs(loss.item() - loss_ref) <= budget * abs(loss_ref)
    for param_name, p in model.named_parameters():
        assert p.grad is not None, param_name
        assert relative_error(p.grad.numpy(), grads_ref[param_name]) <= budget, param_name


def test_a_planted_non_causal_attention_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above can fail: attention without its mask misses the budget."""
    def unmasked(Q, K, V, M=None, *, is_causal=False):  # noqa: ANN001
        return F.scaled_dot_product_attention(Q, K, V)

    config = TINY
    params = random_parameters(config)
    tokens = random_tokens(config, 2, config.n_ctx)
    monkeypatch.setattr(ops, "scaled_dot_product_attention", unmasked)
    got = GPT.from_parameters(params, config, dtype="float64")(torch.as_tensor(tokens))
    assert against_reference(got, tokens, params, config, "float64").fraction > 1e6


def test_a_planted_wrong_gelu_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The exact GELU in place of the tanh one (a classic mix-up) misses the budget."""
    config = TINY  # ffn = gelu_tanh
    params = random_parameters(config)
    tokens = random_tokens(config, 2, config.n_ctx)
    monkeypatch.setitem(ops.FFN, "gelu_tanh", ops.ffn_gelu)
    got = GPT.from_parameters(params, config, dtype="float64")(torch.as_tensor(tokens))
    assert not against_reference(got, tokens, params, config, "float64").passed


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_lower_precision_forward_is_finite_and_near_the_reference(dtype: torch.dtype,
                                                                 device: str) -> None:
    config = TINY
    params = init_parameters(config, seed=3)  # GPT-2's scale: what 16-bit training sees
    tokens = random_tokens(config, 2, config.n_ctx)
    model = GPT.from_parameters(params, config, dtype=dtype, device=device)
    assert model.wte.dtype == dtype
    got = model(torch.as_tensor(tokens))
    assert got.dtype == dtype
    assert torch.isfinite(got).all()
    result = against_reference(got, tokens, params, config, dtype)
    assert result.passed, result.describe()


def test_autocast_bfloat16_forward_is_finite_and_near_the_reference() -> None:
    """Training may keep float32 parameters and compute under autocast: the ops must
    accept the mixed dtypes autocast produces (float32 LayerNorm, bfloat16 products)."""
    config = TINY
    params = init_parameters(config, seed=2)
    tokens = random_tokens(config, 2, config.n_ctx)
    model = GPT.from_parameters(params, config, dtype="float32")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = model(torch.as_tensor(tokens))
    assert got.dtype == torch.bfloat16 and torch.isfinite(got).all()
    result = against_reference(got, tokens, params, config, "bfloat16")
    assert result.passed, result.describe()


def test_float16_stays_finite_when_squares_overflow() -> None:
    """Residual activations near 100 (d = 32): LayerNorm's sum of squares, about 3·10⁵,
    exceeds float16's largest value, 65504; accumulating in float32 keeps it finite. (Both
    ops.layer_norm's upcast and PyTorch's own half kernels accumulate in float32, so this
    checks the property, not which of the two provides it.)"""
    config = TINY
    params = init_parameters(config, seed=0)
    params["wte"] = params["wte"] * 5000.0  # std 100
    tokens = random_tokens(config, 2, config.n_ctx)
    logits = GPT.from_parameters(params, config, dtype="float16")(torch.as_tensor(tokens))
    assert torch.isfinite(logits).all()
    result = against_reference(logits, tokens, params, config, "float16")
    assert result.passed, result.describe()


# --- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        (torch.tensor([[1, 2, -1]]), r"token ids must lie in \[0, 64\)"),
        (torch.tensor([[1, 64]]), r"token ids must lie in \[0, 64\)"),
        (torch.tensor([[1.0, 2.0]]), "tokens must be integers"),
        (torch.tensor([1, 2]), r"tokens must have shape \(B, T\)"),
        (torch.zeros(1, 17, dtype=torch.long), "sequence length 17 exceeds n_ctx=16"),
        (np.array([[1, 2]]), "tokens must be a torch LongTensor"),
    ],
)
def test_bad_tokens_raise_a_clear_error(tokens, message: str) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match=message):
        GPT(TINY)(tokens)


def test_int32_tokens_are_accepted() -> None:
    model = GPT(TINY)
    tokens = torch.as_tensor(random_tokens(TINY, 2, 5))
    assert torch.equal(model(tokens.int()), model(tokens))


def test_from_parameters_refuses_parameters_off_the_schema() -> None:
    params = init_parameters(TINY)
    missing = {k: v for k, v in params.items() if k != "blocks.1.attn.w_o"}
    with pytest.raises(ParameterError, match="'blocks.1.attn.w_o' is missing"):
        GPT.from_parameters(missing, TINY)
    wrong = dict(params, wte=np.zeros((63, 32)))
    with pytest.raises(ParameterError, match="'wte' has shape"):
        GPT.from_parameters(wrong, TINY)
    with pytest.raises(ParameterError, match="unexpected parameter 'w_u'"):
        GPT.from_parameters(dict(params, w_u=np.zeros((32, 64))), TINY)


def test_unknown_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match="unsupported dtype 'int8'"):
        resolve_dtype("int8")
    with pytest.raises(ValueError, match="unsupported dtype"):
        GPT.from_parameters(init_parameters(TINY), TINY, dtype="float8")


# --- parameters in and out ---------------------------------------------------------------------


@pytest.mark.parametrize("name", VARIANTS)
def test_parameters_round_trip(name: str) -> None:
    config = VARIANTS[name]
    params = random_parameters(config)
    back = GPT.from_parameters(params, config, dtype="float64").parameters_numpy()
    assert set(back) == set(params)
    for k in params:
        assert back[k].dtype == np.float64
        np.testing.assert_array_equal(back[k], params[k])
    back32 = GPT.from_parameters(params, config, dtype="float32").parameters_numpy()
    for k in params:  # float32 storage: exactly the float32 rounding of each value
        np.testing.assert_array_equal(back32[k], params[k].astype(np.float32))


def test_from_parameters_copies_torch_tensors() -> None:
    params = {k: torch.as_tensor(v) for k, v in init_parameters(TINY).items()}
    model = GPT.from_parameters(params, TINY, dtype="float64")
    params["wte"].zero_()
    assert model.wte.abs().sum() > 0
    assert all(p.requires_grad for p in model.parameters())


def test_initialisation_follows_gpt2() -> None:
    config = PRESETS["shakespeare-char"]
    model = GPT(config, seed=0)
    p = model.parameters_numpy()
    for s in parameter_schema(config):
        if s.init == "ones":
            np.testing.assert_array_equal(p[s.name], 1.0)
        elif s.init == "zeros":
            np.testing.assert_array_equal(p[s.name], 0.0)
        else:
            n = p[s.name].size
            std = 0.02 / math.sqrt(2 * config.n_layers) if s.init == "residual_normal" else 0.02
            # the sample standard deviation of n normals has relative spread 1/√(2n)
            assert abs(p[s.name].std() / std - 1.0) < 6.0 / math.sqrt(2 * n), s.name
            assert abs(p[s.name].mean()) < 6.0 * std / math.sqrt(n), s.name
    again = GPT(config, seed=0).parameters_numpy()
    other = GPT(config, seed=1).parameters_numpy()
    np.testing.assert_array_equal(again["wte"], p["wte"])
    assert not np.array_equal(other["wte"], p["wte"])


# --- the KV cache -------------------------------------------------------------------------------


def feed_in_chunks(model: GPT, tokens: torch.Tensor, chunks: list[int]) -> torch.Tensor:
    cache = model.new_cache(tokens.shape[0])
    out, start = [], 0
    for size in chunks:
        out.append(model(tokens[:, start : start + size], cache=cache))
        start += size
    assert start == tokens.shape[1]
    assert cache.lengths.tolist() == [start] * tokens.shape[0]
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("name", VARIANTS)
def test_cached_prefill_and_decode_equal_the_full_forward(name: str) -> None:
    config = VARIANTS[name]
    params = random_parameters(config)
    tokens = torch.as_tensor(random_tokens(config, 2, config.n_ctx))
    chunks = [5, 1, 3] + [1] * (config.n_ctx - 9)
    for dtype in ("float64", "float32"):
        model = GPT.from_parameters(params, config, dtype=dtype)
        full = model(tokens)
        cached = feed_in_chunks(model, tokens, chunks)
        for got in (full, cached):
            result = against_reference(got, tokens, params, config, dtype)
            assert result.passed, f"{dtype}: {result.describe()}"


def test_a_cache_at_the_wrong_position_is_caught() -> None:
    """Shifting a sequence's cached length by one (a wrong positional embedding and a
    wrong slot) misses the budget: the cached comparison is sensitive to positions."""
    config = TINY
    params = random_parameters(config)
    model = GPT.from_parameters(params, config, dtype="float64")
    tokens = random_tokens(config, 1, 8)
    want, bound = reference_and_budget(tokens, params, config, "float64")
    cache = model.new_cache(1)
    model(torch.as_tensor(tokens[:, :6]), cache=cache)
    right = model(torch.as_tensor(tokens[:, 6:7]), cache=cache)
    assert B.compare(as_numpy(right), want[:, 6:7], bound[:, 6:7]).passed
    cache.lengths -= 1  # the planted bug: the 8th token goes to position 6, not 7
    cache.uniform_length = None
    wrong = model(torch.as_tensor(tokens[:, 7:8]), cache=cache)
    assert not B.compare(as_numpy(wrong), want[:, 7:8], bound[:, 7:8]).passed


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_batch_of_different_lengths_equals_each_sequence_alone(dtype: torch.dtype,
                                                               device: str) -> None:
    config = TINY
    params = random_parameters(config, seed=4)
    model = GPT.from_parameters(params, config, dtype=dtype, device=device)
    lengths = [3, 7, 1, 5]
    rng = np.random.default_rng(5)
    seqs = [rng.integers(0, config.vocab_size, n + 6) for n in lengths]  # prompt + 6 more
    n_seq, T0 = len(lengths), max(lengths)
    prompt = torch.zeros(n_seq, T0, dtype=torch.long)  # right padding with token 0
    for b, n in enumerate(lengths):
        prompt[b, :n] = torch.as_tensor(seqs[b][:n])
    cache = model.new_cache(n_seq)
    first = model(prompt, cache=cache, lengths=torch.tensor(lengths))
    assert cache.lengths.tolist() == lengths
    steps = [first[b, n - 1] for b, n in enumerate(lengths)]  # each prompt's last logits
    got = [[s] for s in steps]
    for i in range(6):
        nxt = torch.tensor([[int(seqs[b][n + i])] for b, n in enumerate(lengths)])
        out = model(nxt, cache=cache)
        for b in range(n_seq):
            got[b].append(out[b, 0])
    assert cache.lengths.tolist() == [n + 6 for n in lengths]
    for b, n in enumerate(lengths):
        alone = model(torch.as_tensor(seqs[b])[None])[0, n - 1 :]
        batched = torch.stack(got[b][:7])
        want, bound = reference_and_budget(seqs[b][None], params, config, dtype)
        for logits in (alone, batched):
            result = B.compare(as_numpy(logits), want[0, n - 1 :], bound[0, n - 1 :])
            assert result.passed, f"sequence {b}: {result.describe()}"
        assert torch.equal(batched.argmax(-1), alone.argmax(-1))  # the same greedy tokens


def test_last_only_gives_each_sequences_last_real_logits() -> None:
    config = TINY
    params = random_parameters(config, seed=10)
    model = GPT.from_parameters(params, config, dtype="float64")
    tokens = random_tokens(config, 3, 6, seed=11)
    want, bound = reference_and_budget(tokens, params, config, "float64")
    last = model(torch.as_tensor(tokens), last_only=True)
    assert last.shape == (3, 1, config.vocab_size)
    result = B.compare(as_numpy(last), want[:, -1:], bound[:, -1:])
    assert result.passed, result.describe()
    lengths = [6, 2, 4]
    cache = model.new_cache(3)
    last = model(torch.as_tensor(tokens), cache=cache, lengths=torch.tensor(lengths),
                 last_only=True)
    assert last.shape == (3, 1, config.vocab_size)
    for b, n in enumerate(lengths):
        result = B.compare(as_numpy(last[b, 0]), want[b, n - 1], bound[b, n - 1])
        assert result.passed, f"sequence {b}: {result.describe()}"
    with pytest.raises(ValueError, match="last_only needs at least one token"):
        model(torch.as_tensor(tokens[:, :0]), last_only=True)


def test_padded_prefill_then_chunked_feed_keeps_positions() -> None:
    """After a padded prefill, a multi-token feed with its own lengths stays exact."""
    config = PRESETS["tiny-post"]
    model = GPT.from_parameters(random_parameters(config, 6), config, dtype="float64")
    seqs = torch.as_tensor(random_tokens(config, 2, 12, seed=7))
    cache = model.new_cache(2)
    model(torch.stack([seqs[0, :4], seqs[1, :4]]), cache=cache, lengths=torch.tensor([4, 2]))
    # feed 5 more: sequence 0 takes positions 4..8, sequence 1 positions 2..6 (3 real)
    chunk = torch.stack([seqs[0, 4:9], torch.cat([seqs[1, 2:5], torch.zeros(2, dtype=torch.long)])])
    out = model(chunk, cache=cache, lengths=torch.tensor([5, 3]))
    assert cache.lengths.tolist() == [9, 5]
    params = model.parameters_numpy()
    want0, bound0 = reference_and_budget(seqs[0:1, :9].numpy(), params, config, "float64")
    want1, bound1 = reference_and_budget(seqs[1:2, :5].numpy(), params, config, "float64")
    for result in (B.compare(as_numpy(out[0]), want0[0, 4:9], bound0[0, 4:9]),
                   B.compare(as_numpy(out[1, :3]), want1[0, 2:5], bound1[0, 2:5])):
        assert result.passed, result.describe()


def test_padding_never_overwrites_cached_positions() -> None:
    """A finished sequence (0 new tokens) at the end of its cache and padding past it:
    its cached keys and values stay as they were, and the other sequence stays exact."""
    config = TINY
    params = random_parameters(config, seed=8)
    model = GPT.from_parameters(params, config, dtype="float64")
    seqs = random_tokens(config, 2, 6, seed=9)
    cache = model.new_cache(2, max_len=6)
    model(torch.as_tensor(seqs), cache=cache, lengths=torch.tensor([6, 3]))
    k0, v0 = cache.k[:, 0].clone(), cache.v[:, 0].clone()
    k1 = cache.k[:, 1, :, :3].clone()
    pad = torch.tensor([[0, 0], [int(seqs[1, 3]), int(seqs[1, 4])]])
    out = model(pad, cache=cache, lengths=torch.tensor([0, 2]))  # sequence 0: positions 6, 7
    assert cache.lengths.tolist() == [6, 5]
    assert torch.equal(cache.k[:, 0], k0) and torch.equal(cache.v[:, 0], v0)
    assert torch.equal(cache.k[:, 1, :, :3], k1)
    want, bound = reference_and_budget(seqs[1:2, :5], params, config, "float64")
    result = B.compare(as_numpy(out[1]), want[0, 3:5], bound[0, 3:5])
    assert result.passed, result.describe()


def test_cache_refuses_bad_input() -> None:
    model = GPT(TINY)
    cache = model.new_cache(2)
    with pytest.raises(ValueError, match="batch size 3, the cache 2"):
        model(torch.zeros(3, 1, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match=r"lengths must lie in \[0, 4\]"):
        model(torch.zeros(2, 4, dtype=torch.long), cache=cache, lengths=torch.tensor([5, 1]))
    with pytest.raises(ValueError, match="lengths must be an integer tensor of shape"):
        model(torch.zeros(2, 4, dtype=torch.long), cache=cache, lengths=torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="lengths is only meaningful with a cache"):
        model(torch.zeros(2, 4, dtype=torch.long), lengths=torch.tensor([1, 2]))
    model(torch.zeros(2, 16, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="beyond the cache's 16 positions"):
        model(torch.zeros(2, 1, dtype=torch.long), cache=cache)
    assert cache.lengths.tolist() == [16, 16]  # a refused call changes nothing
    cache.reset()
    assert cache.lengths.tolist() == [0, 0]
    with pytest.raises(ValueError, match="the cache is torch.float64"):
        model(torch.zeros(2, 1, dtype=torch.long), cache=KVCache(TINY, 2, dtype="float64"))
    with pytest.raises(ValueError, match="max_len must lie in"):
        KVCache(TINY, 2, max_len=17)


def test_cache_shapes_and_a_shorter_cache() -> None:
    cache = KVCache(TINY, 3, "cpu", torch.float32)
    assert cache.k[0].shape == (3, TINY.n_heads, TINY.n_ctx, TINY.d_head)
    assert cache.v.shape[0] == TINY.n_layers
    short = GPT(TINY).new_cache(1, max_len=4)
    model = GPT(TINY)
    model(torch.zeros(1, 4, dtype=torch.long), cache=short)
    with pytest.raises(ValueError, match="beyond the cache's 4 positions"):
        model(torch.zeros(1, 1, dtype=torch.long), cache=short)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_cached_decode_is_finite_and_near_the_reference(dtype: torch.dtype,
                                                               device: str) -> None:
    model = GPT(TINY, dtype=dtype, device=device)
    tokens = random_tokens(TINY, 2, 10)
    out = feed_in_chunks(model, torch.as_tensor(tokens), [4, 1, 1, 1, 3])
    assert out.dtype == dtype and torch.isfinite(out).all()
    result = against_reference(out, tokens, model.parameters_numpy(), TINY, dtype)
    assert result.passed, result.describe()


# --- torch.compile (optional) ----------------------------------------------------------------


def test_compiled_model_gives_the_eager_logits() -> None:
    # the "eager" backend traces with dynamo without needing a C++ compiler
    model = GPT(TINY)
    tokens = torch.as_tensor(random_tokens(TINY, 2, 9))
    want = model(tokens)
    compiled = compile_model(GPT(TINY), backend="eager")
    torch.testing.assert_close(compiled(tokens), want, rtol=0, atol=0)
    with pytest.raises(ValueError, match="token ids must lie"):
        compiled(tokens + 100)


# --- the conformance-protocol backends ------------------------------------------------------------


def op_cases() -> dict[str, tuple]:
    """Arguments for every backend operation, drawn at random (float64)."""
    rng = np.random.default_rng(11)
    c, cp, cg = TINY, PRESETS["tiny-post"], PRESETS["tiny-guide"]
    p, pp, pg = random_parameters(c), random_parameters(cp), random_parameters(cg)
    b0, bp, bg = block_parameters(p, 0), block_parameters(pp, 0), block_parameters(pg, 0)
    T, d, h = 6, c.d_model, c.n_heads
    H, H2 = rng.normal(size=(2, T, d)), rng.normal(size=(2, T, d))
    Q, K, V = (rng.normal(size=(2, h, T, d // h)) for _ in range(3))
    M = R.causal_mask(T)
    z = 4.0 * rng.normal(size=(2, T, 9))
    tokens = rng.integers(0, c.vocab_size, size=(2, T))
    logits = 3.0 * rng.normal(size=(2, T, c.vocab_size))
    attn = (H, b0["attn.w_qkv"], b0["attn.b_qkv"], b0["attn.w_o"], b0["attn.b_o"], h)
    ffn = (H, b0["ffn.w_1"], b0["ffn.b_1"], b0["ffn.w_2"], b0["ffn.b_2"])
    ffn_g = (H, bg["ffn.w_1"], bg["ffn.b_1"], bg["ffn.w_2"], bg["ffn.b_2"])
    ln = (H, b0["ln_1.weight"], b0["ln_1.bias"], 1e-5)
    return {
        "one_hot": (tokens, c.vocab_size),
        "token_embedding_one_hot": (R.one_hot(tokens, c.vocab_size), p["wte"]),
        "token_embedding": (tokens, p["wte"]),
        "positional_embedding": (T, p["wpe"]),
        "input_representation": (H, H2),
        "linear": (H, b0["ffn.w_1"], b0["ffn.b_1"]),
        "qkv_projection": (H, b0["attn.w_qkv"], b0["attn.b_qkv"]),
        "split_heads": (H, h),
        "merge_heads": (Q,),
        "causal_mask": (T,),
        "softmax_shifted": (z, 3.0),
        "softmax": (z,),
        "attention_scores": (Q, K, M),
        "attention_weights": (Q, K, M),
        "scaled_dot_product_attention": (Q, K, V, M),
        "multi_head_attention": attn,
        "multi_head_attention_head_sum": attn,
        "layer_norm": ln,
        "relu": (z,),
        "gelu": (z,),
        "gelu_tanh": (z,),
        "ffn_relu": ffn,
        "ffn_gelu": ffn,
        "ffn_gelu_tanh": ffn,
        "ffn_guide_product": ffn_g,
        "block_pre_ln": (H, b0, c),
        "block_post_ln": (H, bp, cp),
        "block_guide": (H, bg, cg),
        "final_layer_norm": ln,
        "unembed_tied": (H, p["wte"]),
        "unembed_untied": (H, pg["w_u"], pg["b_u"]),
        "next_token_distribution": (logits,),
        "sequence_log_probability": (tokens, logits),
    }


def assert_same_values(got, want, budget: float) -> None:  # noqa: ANN001
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_same_values(g, w, budget)
        return
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[~finite], want[~finite])  # the mask's −∞ exactly
    if finite.any() and np.abs(want[finite]).max() > 0:
        assert relative_error(got[finite], want[finite]) <= budget


def test_every_backend_operation_is_a_reference_function() -> None:
    implemented = TorchBackend().implemented_ops()
    assert set(implemented) == set(ops.__all__) == set(op_cases())
    assert set(implemented) <= set(R.__all__)
    # what the brief lists as a backend's operations: all of the forward's functions
    forward = {n for m in (R.embedding, R.attention, R.block, R.output) for n in m.__all__}
    assert set(implemented) == forward - {"gpt_forward"}


@pytest.mark.parametrize("name", sorted(op_cases()))
def test_backend_operation_equals_the_reference_in_float64(name: str) -> None:
    args = op_cases()[name]
    got = getattr(TorchBackend(dtype="float64"), name)(*args)
    want = getattr(R, name)(*args)
    assert_same_values(got, want, worst_case_budget(TINY, TINY.n_ctx, torch.float64))


def test_backend_operations_round_inputs_to_their_dtype() -> None:
    backend = TorchBackend(dtype="bfloat16")
    x = np.array([1.0 + 2.0**-12, 3.0])  # 1 + 2⁻¹² is not a bfloat16 value: it rounds to 1
    out = backend.relu(x)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [1.0, 3.0])
    assert backend.causal_mask(3).dtype == np.float32
    assert backend.one_hot(np.array([2]), 4).tolist() == [[0.0, 0.0, 1.0, 0.0]]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_torch_backend_forward(dtype: str, device: str) -> None:
    backend = TorchBackend(device=device, dtype=dtype)
    assert (backend.name, backend.device, backend.dtype) == ("torch", device, dtype)
    assert "torch" in backend.version and "gptspec" in backend.version
    params = random_parameters(TINY)
    tokens = random_tokens(TINY, 2, 7)
    got = backend.forward(tokens, params, TINY)
    assert got.shape == (2, 7, TINY.vocab_size)
    assert got.dtype == (np.float32 if dtype == "bfloat16" else np.dtype(dtype))
    result = against_reference(got, tokens, params, TINY, dtype)
    assert result.passed, result.describe()


def test_torch_backend_reuses_a_model_with_the_new_parameters() -> None:
    """The backend keeps a few models and refills them: every call still uses its own
    parameters, whatever the order of configurations."""
    backend = TorchBackend(dtype="float64")
    configs = [TINY, PRESETS["tiny-post"], TINY, TINY, PRESETS["tiny-guide"], TINY]
    tokens = random_tokens(TINY, 2, 5)
    for seed, config in enumerate(configs):
        params = random_parameters(config, seed=seed)
        result = against_reference(backend.forward(tokens, params, config), tokens, params,
                                   config, "float64")
        assert result.passed, f"call {seed}: {result.describe()}"
    assert len(backend._models) == 3
    with pytest.raises(ParameterError, match="'wte' has shape"):
        backend.forward(tokens, dict(random_parameters(TINY), wte=np.zeros((3, 32))), TINY)


def test_torch_backend_refuses_unknown_names_and_devices() -> None:
    backend = TorchBackend()
    with pytest.raises(AttributeError, match="no attribute or operation 'gpt_forward'"):
        backend.gpt_forward  # noqa: B018
    assert not hasattr(backend, "sampling_top_k")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            TorchBackend(device="cuda")


def test_reference_backend() -> None:
    backend = ReferenceBackend()
    assert (backend.name, backend.device, backend.dtype) == ("reference", "cpu", "float64")
    params = random_parameters(TINY)
    tokens = random_tokens(TINY, 2, 5)
    np.testing.assert_array_equal(backend.forward(tokens, params, TINY),
                                  gpt_forward(tokens, params, TINY))
    assert set(backend.implemented_ops()) == set(R.__all__) - {"gpt_forward"}
    for name in backend.implemented_ops():
        assert getattr(backend, name) is getattr(R, name)
    with pytest.raises(AttributeError):
        backend.no_such_op  # noqa: B018


# --- 16-bit gradients are summed in float32 ------------------------------------------------
# PyTorch 2.13's CPU backward of a 16-bit LayerNorm sums ∂γ and ∂β over the rows, and its
# F.embedding backward sums a repeated token's rows, in the 16-bit dtype. The spec sums in
# float32 and rounds once; these pin the built-in backend to that, at sizes where the
# difference is hundreds of roundings.

SIXTEEN_BIT = [(torch.bfloat16, 2.0**-8), (torch.float16, 2.0**-11)]


@pytest.mark.parametrize(("dtype", "u"), SIXTEEN_BIT)
def test_layer_norm_parameter_gradients_are_one_rounding_off(dtype: torch.dtype,
                                                             u: float) -> None:
    rows, d = 1024, 64
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, d, generator=gen).to(dtype).requires_grad_()
    gamma = torch.randn(d, generator=gen).to(dtype).requires_grad_()
    beta = torch.zeros(d, dtype=dtype, requires_grad=True)
    upstream = (torch.rand(rows, d, generator=gen) + 0.5).to(dtype)  # one sign: no cancelling
    ops.layer_norm(x, gamma, beta, 1e-5).backward(upstream)
    exact = upstream.double().sum(0)
    # float32 sums of 1024 terms add at most 1024·2⁻²⁴ ≈ 6·10⁻⁵ relative: far below u
    assert torch.all((beta.grad.double() - exact).abs() <= 1.01 * u * exact.abs())


@pytest.mark.parametrize(("dtype", "u"), SIXTEEN_BIT)
def test_a_repeated_tokens_embedding_gradient_is_one_rounding_off(dtype: torch.dtype,
                                                                 u: float) -> None:
    W = torch.randn(4, 8, dtype=torch.float64).to(dtype).requires_grad_()
    tokens = torch.zeros(2, 1024, dtype=torch.long)  # token 0 at all 2048 positions
    upstream = (torch.rand(2, 1024, 8, generator=torch.Generator().manual_seed(1))
                + 0.5).to(dtype)
    ops.token_embedding(tokens, W).backward(upstream)
    exact = upstream.double().reshape(-1, 8).sum(0)
    assert torch.all((W.grad[0].double() - exact).abs() <= 1.01 * u * exact.abs())
    assert torch.all(W.grad[1:] == 0)


@pytest.mark.parametrize(("dtype", "u"), SIXTEEN_BIT)
def test_layer_norm_bias_gradient_alone_is_one_rounding_off(dtype: torch.dtype,
                                                            u: float) -> None:
    # only β trains (x and γ frozen): the widened path must still be taken
    rows, d = 1024, 64
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(rows, d, generator=gen).to(dtype)
    gamma = torch.randn(d, generator=gen).to(dtype)
    beta = torch.zeros(d, dtype=dtype, requires_grad=True)
    upstream = (torch.rand(rows, d, generator=gen) + 0.5).to(dtype)
    ops.layer_norm(x, gamma, beta, 1e-5).backward(upstream)
    exact = upstream.double().sum(0)
    assert torch.all((beta.grad.double() - exact).abs() <= 1.01 * u * exact.abs())


def test_backend_operations_sum_16bit_products_in_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every backend call runs with PyTorch's reduced-precision reductions off (cuBLAS
    would otherwise add split-K partial sums in 16 bit), and the user's settings return."""
    matmul = torch.backends.cuda.matmul
    seen = []

    def spy(x: torch.Tensor) -> torch.Tensor:
        seen.append((matmul.allow_bf16_reduced_precision_reduction,
                     matmul.allow_fp16_reduced_precision_reduction))
        return x

    monkeypatch.setattr(ops, "relu", spy)
    monkeypatch.setattr(matmul, "allow_bf16_reduced_precision_reduction", True)
    monkeypatch.setattr(matmul, "allow_fp16_reduced_precision_reduction", True)
    TorchBackend(dtype="bfloat16")._operation("relu")(np.ones(3))
    assert seen == [(False, False)]
    assert matmul.allow_bf16_reduced_precision_reduction
    assert matmul.allow_fp16_reduced_precision_reduction


def test_overlapping_backend_calls_keep_float32_sums_until_the_last_one_leaves(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two threads' calls overlap: the one that leaves first must not turn the
    reduced-precision reductions back on under the other, and the last one restores the
    user's settings."""
    import threading

    matmul = torch.backends.cuda.matmul
    monkeypatch.setattr(matmul, "allow_bf16_reduced_precision_reduction", True)
    monkeypatch.setattr(matmul, "allow_fp16_reduced_precision_reduction", True)
    first_inside, second_inside, first_left = (threading.Event() for _ in range(3))
    seen = []

    def spy(x: torch.Tensor) -> torch.Tensor:
        if threading.current_thread().name == "first":  # returns once the second is inside
            first_inside.set()
            second_inside.wait(10)
        else:  # and the second looks after the first returned
            second_inside.set()
            first_left.wait(10)
            seen.append((matmul.allow_bf16_reduced_precision_reduction,
                         matmul.allow_fp16_reduced_precision_reduction))
        return x

    monkeypatch.setattr(ops, "relu", spy)
    relu = TorchBackend(dtype="bfloat16")._operation("relu")
    second = threading.Thread(target=lambda: (first_inside.wait(10), relu(np.ones(3))))
    second.start()
    first = threading.Thread(target=lambda: relu(np.ones(3)), name="first")
    first.start()
    first.join(10)
    first_left.set()
    second.join(10)
    assert seen == [(False, False)]
    assert matmul.allow_bf16_reduced_precision_reduction
    assert matmul.allow_fp16_reduced_precision_reduction
