"""gptspec.fast.decode: the decoding step without the module machinery.

It must compute exactly what the model's cached forward computes (the same operations in
the same order: equal logits, bit for bit, in every dtype and residual form it takes),
advance the cache the same way, be what generation uses for its uniform steps, and step
aside wherever it does not apply.
"""

from __future__ import annotations

import pytest
import torch

from gptspec.fast import prepacked
from gptspec.fast.decode import DecodeStep
from gptspec.fast.generate import GREEDY, generate, stream
from gptspec.fast.model import GPT
from gptspec.spec import preset


def _model(name: str, dtype: str, seed: int = 0) -> GPT:
    return GPT(preset(name), seed=seed, dtype=dtype).eval().requires_grad_(False)


@pytest.mark.parametrize("name", ["tiny", "tiny-post", "shakespeare-char"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("batch", [1, 3])
def test_decode_step_equals_the_models_cached_forward(name, dtype, batch):
    model = _model(name, dtype)
    packed = prepacked.for_model(model)
    decode = DecodeStep(model, packed)
    with torch.inference_mode():
        _decode_alongside_the_model(model, packed, decode, batch)


@pytest.mark.parametrize("changes", [
    dict(attn_bias=False),  # the Blueprint's attention: no b_QKV, no b_O
    dict(positional_embedding=False),  # no W_P: the Guide's embedding
    dict(d_head=5),  # h·d_H = 20 ≠ d_model = 32: the Notes' free head width
], ids=["no-attn-bias", "no-positions", "free-head-width"])
def test_decode_step_takes_each_documents_switches(changes):
    model = GPT(preset("tiny-post").replace(**changes), seed=0, dtype="float32")
    model = model.eval().requires_grad_(False)
    with torch.inference_mode():
        _decode_alongside_the_model(model, None, DecodeStep(model, None), 2)


def _decode_alongside_the_model(model, packed, decode, batch):
    gen = torch.Generator().manual_seed(batch)
    V = model.config.vocab_size
    prompt = torch.randint(0, V, (batch, 5), generator=gen)
    ours, theirs = model.new_cache(batch), model.new_cache(batch)
    model(prompt, cache=ours)
    model(prompt, cache=theirs)
    for _ in range(8):
        tokens = torch.randint(0, V, (batch,), generator=gen)
        assert DecodeStep.applies_to(ours)
        got = decode(tokens, ours)
        want = model(tokens[:, None], cache=theirs, weights=packed)[:, 0]
        assert got.shape == (batch, V) and got.dtype == want.dtype
        assert torch.equal(got, want)
        assert torch.equal(ours.lengths, theirs.lengths)
        assert torch.equal(ours.k, theirs.k) and torch.equal(ours.v, theirs.v)


def test_the_guides_product_ffn_is_left_to_the_model():
    assert not DecodeStep.supports(_model("tiny-guide", "float32"))
    assert DecodeStep.supports(_model("tiny-post", "float32"))


def test_it_applies_only_to_a_cache_of_one_length_with_room():
    model = _model("tiny", "float32")
    cache = model.new_cache(2, max_len=6)
    assert DecodeStep.applies_to(cache)  # empty: every sequence at length 0
    model(torch.tensor([[1, 2, 3], [4, 5, 0]]), cache=cache, lengths=torch.tensor([3, 2]))
    assert not DecodeStep.applies_to(cache)  # lengths 3 and 2
    cache.reset()
    model(torch.tensor([[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6]]), cache=cache)
    assert not DecodeStep.applies_to(cache)  # full


def test_generation_decodes_its_uniform_steps_and_hands_the_rest_to_the_model(monkeypatch):
    """All sequences running: the decoding step. One stopped (end-of-text): the model,
    which skips it in the cache."""
    model = _model("tiny", "float32")
    used = []
    original = DecodeStep.__call__
    monkeypatch.setattr(DecodeStep, "__call__",
                        lambda self, *a: used.append(1) or original(self, *a))
    generate(model, [[1, 2, 3], [4, 5, 6]], 6, GREEDY)
    assert len(used) == 5  # every step after the prompt's forward
    used.clear()
    first = generate(model, [[1, 2, 3]], 1, GREEDY)[0][0]
    out = generate(model, [[1, 2, 3], [7, 8, 9]], 6, GREEDY, eot_token=first)
    assert out[0] == [first] and len(out[1]) >= 1
    assert len(used) == 0  # sequence 0 stopped at once: every later step is non-uniform


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
    u = torch.finfo(getattr(torch, dtype)).eps / 2
    for a, b in zip(got_logits, want_logits, strict=True):  # two roundings apart at most
        assert torch.allclose(a, b, rtol=0, atol=8 * u * b.abs().max().item())
