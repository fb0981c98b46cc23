"""GPT.run: one forward for the whole sequence, the cached prompt and the decoding step.

Every path is the same operations in the same order, placed by a ``Plan``: the prompt fed
into an empty cache gives the whole forward's logits bit for bit, one-token steps give
its rows within a few roundings, the cheap plan of the common step (one new token per
sequence, all at one length: no mask, nothing read from the device) equals the general
one, and generation binds its packed weights only while it runs.
"""

from __future__ import annotations

import pytest
import torch

from gptspec.fast.generate import GREEDY, generate, stream
from gptspec.fast.kv_cache import KVCache, Plan
from gptspec.fast.model import GPT
from gptspec.spec import preset

NAMES = ["tiny", "tiny-post", "tiny-guide", "shakespeare-char"]
DTYPES = ["float32", "bfloat16", "float16"]


def _model(name: str, dtype: str, seed: int = 0) -> GPT:
    return GPT(preset(name), seed=seed, dtype=dtype).eval().requires_grad_(False)


def _tokens(model: GPT, batch: int, T: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (batch, T), generator=gen)


def _close(got: torch.Tensor, want: torch.Tensor, dtype: str, n_layers: int = 2) -> bool:
    """Within a few roundings of the dtype per layer (kernels that see T rows or one
    accumulate in their own orders)."""
    u = torch.finfo(getattr(torch, dtype)).eps / 2
    return torch.allclose(got.float(), want.float(), rtol=0,
                          atol=8 * n_layers * u * want.float().abs().max().item())


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [1, 3])
def test_the_cached_prompt_is_the_whole_forward_bit_for_bit(name, dtype, batch):
    model = _model(name, dtype)
    tokens = _tokens(model, batch, 7)
    with torch.inference_mode():
        whole = model(tokens)
        cache = model.new_cache(batch)
        assert torch.equal(model(tokens, cache=cache), whole)
        assert torch.equal(model(tokens, cache=model.new_cache(batch), last_only=True),
                           model(tokens, last_only=True))
    assert cache.lengths.tolist() == [7] * batch and cache.uniform_length == 7


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [1, 3])
def test_one_token_steps_give_the_whole_forwards_rows(name, dtype, batch):
    model = _model(name, dtype)
    tokens = _tokens(model, batch, 12, seed=batch)
    with torch.inference_mode():
        whole = model(tokens)
        cache = model.new_cache(batch)
        model(tokens[:, :5], cache=cache)
        for t in range(5, 12):
            step = model(tokens[:, t : t + 1], cache=cache)
            assert step.shape == (batch, 1, model.config.vocab_size)
            assert _close(step[:, 0], whole[:, t], dtype, model.config.n_layers), t


@pytest.mark.parametrize("changes", [
    dict(attn_bias=False),  # the Blueprint's attention: no b_QKV, no b_O
    dict(positional_embedding=False),  # no W_P: the Guide's embedding
    dict(d_head=5),  # h·d_H = 20 ≠ d_model = 32: the Notes' free head width
], ids=["no-attn-bias", "no-positions", "free-head-width"])
def test_each_documents_switches_take_the_same_forward(changes):
    model = GPT(preset("tiny-post").replace(**changes), seed=0).eval().requires_grad_(False)
    tokens = _tokens(model, 2, 9)
    with torch.inference_mode():
        whole = model(tokens)
        cache = model.new_cache(2)
        assert torch.equal(model(tokens[:, :6], cache=cache), whole[:, :6])
        for t in range(6, 9):
            assert _close(model(tokens[:, t : t + 1], cache=cache)[:, 0], whole[:, t], "float32")


def test_the_common_steps_plan_reads_nothing_and_needs_no_mask():
    """One new token per sequence, all at one length: the plan is built from the cache's
    Python-side length alone (no device read, no mask tensor); a first feed is causal,
    several tokens after others take the explicit mask, and a ragged batch its rows."""
    model = _model("tiny", "float32")
    cache = model.new_cache(2, max_len=8)
    first = cache.plan(3)
    assert first.causal and first.mask is None and first.start == 0 and first.rows is None
    model(_tokens(model, 2, 3), cache=cache)
    step = cache.plan(1)
    assert (step.start, step.causal, step.mask, step.positions, step.n_keys) == \
        (3, False, None, None, 4)
    several = cache.plan(2)
    assert not several.causal and several.mask is not None
    assert several.mask.shape == (2, 1, 2, 5)
    ragged = cache.plan(1, torch.tensor([1, 0]))
    assert ragged.rows is not None and ragged.mask is not None and ragged.positions is not None
    with pytest.raises(ValueError, match="beyond the cache"):
        cache.plan(6)
    assert Plan() == Plan(start=0, causal=True)  # the whole sequence: no cache


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_common_steps_plan_equals_the_general_one(dtype):
    """The same one-token step through the plan of one length (slice writes, no mask) and
    through the general plan (indexed writes, explicit mask) of a ragged batch whose
    sequences all take their token: the same logits and the same cache."""
    model = _model("shakespeare-char", dtype)
    tokens = _tokens(model, 3, 9)
    fast, general = model.new_cache(3), model.new_cache(3)
    with torch.inference_mode():
        model(tokens[:, :5], cache=fast)
        model(tokens[:, :5], cache=general, lengths=torch.tensor([5, 5, 5]))
        assert fast.uniform_length == 5 and general.uniform_length is None
        for t in range(5, 9):
            a = model(tokens[:, t : t + 1], cache=fast)
            b = model(tokens[:, t : t + 1], cache=general)
            assert _close(a, b, dtype, model.config.n_layers)
    assert torch.equal(fast.lengths, general.lengths)
    for x, y in ((fast.k, general.k), (fast.v, general.v)):
        assert _close(x, y, dtype, model.config.n_layers)


def test_generation_takes_the_common_plan_for_its_uniform_steps(monkeypatch):
    """All sequences running: every step after the prompt is the cheap plan. One stopped
    (end-of-text): the general plan, which skips it in the cache."""
    model = _model("tiny", "float32")
    plans: list[Plan] = []
    original = KVCache.plan
    monkeypatch.setattr(KVCache, "plan", lambda self, *a: plans.append(original(self, *a))
                        or plans[-1])
    generate(model, [[1, 2, 3], [4, 5, 6]], 6, GREEDY)
    assert len(plans) == 6 and plans[0].causal
    assert all(p.mask is None and p.rows is None for p in plans[1:])
    plans.clear()
    first = generate(model, [[1, 2, 3]], 1, GREEDY)[0][0]
    plans.clear()
    out = generate(model, [[1, 2, 3], [7, 8, 9]], 6, GREEDY, eot_token=first)
    assert out[0] == [first] and len(out[1]) >= 1
    assert all(p.rows is not None for p in plans[1:])  # sequence 0 stopped at once


def test_compiled_whole_sequence_path_is_the_eager_one():
    from gptspec.fast.model import compile_model

    model = _model("tiny", "float32")
    tokens = _tokens(model, 2, 6)
    with torch.inference_mode():
        want = model(tokens)
    compiled = compile_model(_model("tiny", "float32"), backend="eager")
    with torch.inference_mode():
        assert torch.equal(compiled(tokens), want)
        cache = compiled.new_cache(2)  # the cached path stays eager
        assert torch.equal(compiled(tokens, cache=cache), want)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_weights_changed_between_streamed_tokens_are_used(dtype):
    """A caller may change the weights between two tokens of a stream: the next steps
    use the new ones (a stale packed copy is rebuilt, never used). Compared with the same
    stream multiplying by the parameters as they are (prepack=False)."""
    def run(prepack: bool) -> tuple[list[int], list[torch.Tensor]]:
        model, changed = _model("tiny", dtype), _model("tiny", dtype, seed=1)
        tokens, logits = [], []
        for step in stream(model, [[1, 2, 3]], 6, GREEDY, keep_logits=True, prepack=prepack):
            tokens.append(step.tokens[0])
            logits.append(step.logits[0].float())
            if step.index == 2:
                with torch.no_grad():
                    for p, q in zip(model.parameters(), changed.parameters(), strict=True):
                        p.copy_(q)
        return tokens, logits

    (got, got_logits), (want, want_logits) = run(True), run(False)
    assert got == want
    for a, b in zip(got_logits, want_logits, strict=True):  # two roundings apart at most
        assert _close(a, b, dtype)
