"""The paths the suite now exercises: ragged batches and every variant through the decoding
step, token sequences that are not UTF-8, and text whose pre-tokenization matters.
The honest backend passes those checks; each bug planted on those paths fails one."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gptspec.conformance.registry import all_checks
from gptspec.conformance.runner import run_suite
from gptspec.conformance.strategies import configs, ragged_prompts
from gptspec.conformance.text_strategies import (
    invalid_utf8,
    is_utf8,
    pretokenization_texts,
    spanning_merges,
)
from gptspec.fast.backend import TorchBackend
from gptspec.reference import tokenizer as ref
from gptspec.spec import REGISTRY
from meta.mutants import BY_NAME

GENERATION_CHECKS = ("generate.every_variant", "generate.ragged_batch")
TOKENIZER_CHECKS = ("decode.invalid_utf8", "encode.matches_reference")
NEW_MUTANTS = {
    "ragged_positions_from_padded_length": "generate.ragged_batch",
    "ragged_cache_attends_padding": "generate.ragged_batch",
    "ragged_decode_step_at_longest_length": "generate.ragged_batch",
    "contractions_case_insensitive": "encode.matches_reference",
    "digits_grouped_by_three": "encode.matches_reference",
    "whitespace_cut_ascii_only": "encode.matches_reference",
    "whitespace_lookahead_dropped": "encode.matches_reference",
    "decode_ignores_invalid_bytes": "decode.invalid_utf8",
    "decode_replaces_each_invalid_byte": "decode.invalid_utf8",
}


# --- the decision on ill-formed UTF-8, against the Unicode Standard's own table --------------

# Table 3-7 of the Unicode Standard: the first byte of a well-formed sequence, and the
# ranges its following bytes must lie in.
WELL_FORMED = (
    ((0x00, 0x7F), ()),
    ((0xC2, 0xDF), ((0x80, 0xBF),)),
    ((0xE0, 0xE0), ((0xA0, 0xBF), (0x80, 0xBF))),
    ((0xE1, 0xEC), ((0x80, 0xBF), (0x80, 0xBF))),
    ((0xED, 0xED), ((0x80, 0x9F), (0x80, 0xBF))),
    ((0xEE, 0xEF), ((0x80, 0xBF), (0x80, 0xBF))),
    ((0xF0, 0xF0), ((0x90, 0xBF), (0x80, 0xBF), (0x80, 0xBF))),
    ((0xF1, 0xF3), ((0x80, 0xBF), (0x80, 0xBF), (0x80, 0xBF))),
    ((0xF4, 0xF4), ((0x80, 0x8F), (0x80, 0xBF), (0x80, 0xBF))),
)


def decode_by_maximal_subparts(data: bytes) -> str:
    """The spec's decision written from the table: keep each well-formed sequence's code
    point; replace each maximal subpart (the longest prefix of a well-formed sequence
    read before it fails, or one byte that starts none) by one U+FFFD."""
    out, i = [], 0
    while i < len(data):
        follow = next((f for (lo, hi), f in WELL_FORMED if lo <= data[i] <= hi), None)
        if follow is None:
            out.append("\ufffd")
            i += 1
            continue
        n = 1
        for lo, hi in follow:
            if i + n < len(data) and lo <= data[i + n] <= hi:
                n += 1
            else:
                break
        if n == 1 + len(follow):
            code = data[i] & (0xFF >> (n + 1) if n > 1 else 0x7F)
            for b in data[i + 1 : i + n]:
                code = (code << 6) | (b & 0x3F)
            out.append(chr(code))
        else:
            out.append("\ufffd")
        i += n
    return "".join(out)


@pytest.mark.parametrize(("data", "text"), [
    (b"\xe4\xb8", "\ufffd"),  # a character cut short at the end
    (b"a\xe4\xb8b", "a\ufffdb"),
    (b"\xc0\x80", "\ufffd\ufffd"),  # overlong
    (b"\xe0\x80\x80", "\ufffd" * 3),
    (b"\xed\xa0\x80", "\ufffd" * 3),  # an encoded surrogate
    (b"\xf4\x90\x80\x80", "\ufffd" * 4),  # above U+10FFFF
    (b"\xf0\x9f\x98", "\ufffd"),
    (b"\x80\xbf", "\ufffd\ufffd"),  # lone continuation bytes
    (b"\xff\xfe\xf5", "\ufffd" * 3),
])
def test_the_reference_decodes_ill_formed_utf8_as_the_decision_says(data, text):
    assert ref.decode(list(data), []) == text
    assert decode_by_maximal_subparts(data) == text


@settings(max_examples=300, deadline=None)
@given(data=invalid_utf8() | st.binary(max_size=24))
def test_the_reference_decode_is_one_replacement_per_maximal_subpart(data):
    assert ref.decode(list(data), []) == decode_by_maximal_subparts(data)
    assert REGISTRY["decode"].sympy([*data], []) == decode_by_maximal_subparts(data)


@settings(max_examples=200, deadline=None)
@given(data=invalid_utf8())
def test_the_invalid_utf8_strategy_draws_only_ill_formed_bytes(data):
    assert not is_utf8(data)


# --- the strategies keep their preconditions --------------------------------------------------

@settings(max_examples=100, deadline=None)
@given(st.data())
def test_ragged_prompts_have_two_lengths_below_n_ctx(data):
    config = data.draw(configs(max_ctx=10).filter(lambda c: c.n_ctx >= 2))
    prompts = data.draw(ragged_prompts(config))
    lengths = {len(p) for p in prompts}
    assert len(lengths) >= 2 and max(lengths) < config.n_ctx
    assert all(0 <= t < config.vocab_size for p in prompts for t in p)


def test_the_spanning_merges_make_the_patterns_chunk_boundaries_visible():
    # GPT-2's pattern splits "'S" (upper case is not a contraction) and "  word" before
    # its last space, the cl100k-style one splits digit runs in threes; merges learned
    # from whole lines span those boundaries, so the chunking shows in the tokens
    merges = list(spanning_merges())
    vocab = ref.token_bytes(merges)
    for text, pattern in (("It'S", ref.GPT2_PATTERN), ("a  the", ref.GPT2_PATTERN),
                          ("1234", ref.CL100K_PATTERN)):
        tokens = ref.encode(text, merges, pattern)
        whole = [vocab[t] for t in ref.encode(text, merges, r"(?s).+")]
        assert [vocab[t] for t in tokens] != whole, text


@settings(max_examples=50, deadline=None)
@given(text=pretokenization_texts(special=True))
def test_grammar_texts_round_trip_through_the_reference(text):
    merges = list(spanning_merges())
    special = {ref.ENDOFTEXT: 256 + len(merges)}
    ids = ref.encode(text, merges, ref.GPT2_PATTERN, special, allowed_special="all")
    assert ref.decode(ids, merges, special) == text


# --- the honest backend passes, the planted bugs fail ------------------------------------------

def test_the_new_checks_are_registered_with_their_entries():
    checks = {c.id: c for c in all_checks()}
    for cid in GENERATION_CHECKS + TOKENIZER_CHECKS:
        assert cid in checks, cid
    assert {"block_post_ln", "ffn_guide_product"} <= set(checks["generate.every_variant"].entries)
    assert "kv_cache_attention" in checks["generate.ragged_batch"].entries
    assert "pretokenize" in checks["encode.matches_reference"].entries


def _passes(backend, ids):
    suite = run_suite(backend, profile="quick", seed=0, area=None, select=lambda c: c.id in ids)
    results = {r.id: r for r in suite.results}
    for cid in ids:
        assert results[cid].status == "pass", f"{cid}: {results[cid].detail}"
    return results


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_torch_backend_passes_the_generation_paths(dtype):
    results = _passes(TorchBackend("cpu", dtype), GENERATION_CHECKS)
    assert all(results[c].worst_fraction for c in GENERATION_CHECKS), "nothing was compared"


def test_the_fast_tokenizer_passes_the_tokenizer_paths():
    _passes(TorchBackend("cpu", "float32"), TOKENIZER_CHECKS)


@pytest.mark.parametrize("name", sorted(NEW_MUTANTS))
def test_each_new_mutant_fails_its_new_check_naming_an_entry_it_breaks(name):
    mutant = BY_NAME[name]
    check_id = NEW_MUTANTS[name]
    suite = run_suite(mutant.backend(), profile="quick", seed=0, area=mutant.area,
                      select=lambda c: c.id == check_id)
    [result] = suite.results
    assert result.status == "fail", (name, result.status, result.detail)
    assert set(result.entries) & set(mutant.breaks), (name, result.entries)
