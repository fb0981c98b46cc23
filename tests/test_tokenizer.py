"""The tokenizer: spec ↔ reference, reference facts worked by hand, fast ↔ reference,
the conformance checks (and that they catch planted bugs), errors on bad input."""

from __future__ import annotations

import inspect
import json
import time
from collections import Counter

import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

import gptspec.reference as reference
from gptspec.conformance import checks_tokenizer as checks
from gptspec.conformance.registry import all_checks, checks_for
from gptspec.conformance.runner import run_suite
from gptspec.conformance.text_strategies import any_merges, spelled_texts
from gptspec.fast.tokenizer import (
    ENDOFTEXT,
    GPT2_NO_LOOKAHEAD,
    WHITE_SPACE,
    FastTokenizerBackend,
    Tokenizer,
    TokenizerError,
    bpe_lowest_rank_first,
    cut_whitespace_runs,
    merges_follow_byte_ranks,
    split_for_threads,
    train_merges,
)
from gptspec.reference import tokenizer as ref
from gptspec.spec import REGISTRY

ENTRIES = REGISTRY.by_group("tokenizer")
SMALL = settings(max_examples=60, deadline=None)
small_texts = checks.texts


def corpus() -> str:
    """Real text every machine has: the source of a few standard-library modules."""
    import argparse
    import json as json_module
    import textwrap

    return "".join(inspect.getsource(m) for m in (textwrap, json_module.decoder, argparse))


# --- spec ↔ reference ----------------------------------------------------------------------


def test_every_tokenizer_entry_has_its_reference_function_and_back():
    names = {e.id for e in ENTRIES}
    assert names == set(ref.__all__)
    for entry in ENTRIES:
        assert entry.reference == entry.id
        assert callable(getattr(reference, entry.reference))
        assert callable(entry.sympy) and entry.sympy_inputs == ()
        assert f"def {entry.id}(" in entry.sympy_source


def test_one_hot_is_not_duplicated_here():
    assert "one_hot" not in {e.id for e in ENTRIES}
    assert REGISTRY["one_hot"].group == "embedding"
    assert "one_hot" in REGISTRY["encode"].notes


def spec(name):
    return REGISTRY[name].sympy


@SMALL
@given(small_texts(), st.sampled_from(checks.PATTERNS))
def test_pretokenize_spec_equals_reference_and_covers_the_text(text, pattern):
    chunks = ref.pretokenize(text, pattern)
    assert spec("pretokenize")(text, pattern) == chunks
    assert "".join(chunks) == text


@SMALL
@given(st.lists(st.lists(st.integers(0, 4), max_size=6), max_size=6))
def test_pair_counts_spec_equals_reference(words):
    chunks = Counter(tuple(w) for w in words)
    assert spec("pair_counts")(chunks) == dict(ref.pair_counts(chunks))


@SMALL
@given(st.dictionaries(st.tuples(st.integers(0, 5), st.integers(0, 5)), st.integers(0, 4)))
def test_best_pair_spec_equals_reference(counts):
    assert spec("best_pair")(counts) == ref.best_pair(counts)


@SMALL
@given(st.lists(st.integers(0, 3), max_size=12), st.tuples(st.integers(0, 3), st.integers(0, 3)))
def test_merge_pair_spec_equals_reference(ids, pair):
    assert spec("merge_pair")(ids, pair, 9) == ref.merge_pair(ids, pair, 9)


@settings(max_examples=30, deadline=None)
@given(small_texts(max_size=30), st.integers(256, 275), st.lists(small_texts(), max_size=3))
def test_train_encode_decode_token_bytes_spec_equal_reference(text, vocab_size, samples):
    merges = ref.train(text, vocab_size, ref.GPT2_PATTERN)
    assert spec("train")(text, vocab_size) == merges
    assert spec("token_bytes")(merges) == ref.token_bytes(merges)
    for s in samples:
        ids = ref.encode(s, merges)
        assert spec("encode")(s, merges) == ids
        for chunk in ref.pretokenize(s):
            data = chunk.encode()
            assert spec("bpe_chunk")(data, merges) == ref.bpe_chunk(data, merges)
        assert spec("decode")(ids, merges) == ref.decode(ids, merges) == s


@SMALL
@given(small_texts(), small_texts(), st.booleans())
def test_split_special_spec_equals_reference(a, b, allowed):
    specials = {ENDOFTEXT: 300, "<|x|>": 301}
    text = a + ENDOFTEXT + b
    allow = {ENDOFTEXT} if allowed else set()
    if allowed:
        assert spec("split_special")(text, specials, allow) == ref.split_special(text, specials,
                                                                                  allow)
    else:
        with pytest.raises(ValueError):
            spec("split_special")(text, specials, allow)
        with pytest.raises(ValueError, match="not allowed"):
            ref.split_special(text, specials, allow)


def test_byte_tokens_and_bytes_to_unicode_spec_equal_reference():
    assert spec("byte_tokens")() == ref.byte_tokens()
    assert spec("bytes_to_unicode")() == ref.bytes_to_unicode()


# --- reference facts, worked out by hand --------------------------------------------------


def test_train_on_the_classic_example_worked_by_hand():
    # aaabdaaabac: (a,a) occurs 4 times (overlaps count) → 256. Then (a,b) and (256,a)
    # tie at 2: the lexicographically smaller (97, 98) → 257. Then (256, 257) → 258.
    # All remaining counts are 1, so the smallest pair wins each time: (97, 99),
    # (100, 258), (258, 260), (261, 259); then one token is left and training stops.
    expected = [(97, 97), (97, 98), (256, 257), (97, 99), (100, 258), (258, 260), (261, 259)]
    assert ref.train("aaabdaaabac", 266) == expected
    assert train_merges("aaabdaaabac", 10) == expected
    assert ref.encode("aaabdaaabac", expected) == [262]


def test_tie_break_is_the_smallest_pair_not_the_first_seen():
    # (5, 1) is seen first; (1, 9) is smaller
    assert ref.best_pair({(5, 1): 3, (1, 9): 3, (0, 0): 2}) == (1, 9)
    assert ref.best_pair({}) is None and ref.best_pair({(1, 2): 0}) is None
    assert train_merges("ba", 1) == [(98, 97)] and train_merges("ba\nab", 1) == [(97, 98)]


def test_merge_pair_skips_overlaps_left_to_right():
    assert ref.merge_pair([1, 1, 1], (1, 1), 7) == [7, 1]
    assert ref.merge_pair([1, 1, 1, 1], (1, 1), 7) == [7, 7]


def test_no_merge_crosses_a_chunk_or_a_special_token():
    # "a a": chunks "a", " a"; the pair (97, 32) never occurs inside a chunk
    merges = ref.train("a a a a", 300)
    assert (97, 32) not in merges and merges[0] == (32, 97)
    assert ref.train("ab<|endoftext|>ab", 300, special_tokens=[ENDOFTEXT]) == [(97, 98)]
    assert train_merges("ab<|endoftext|>ab", 44, special_tokens=[ENDOFTEXT]) == [(97, 98)]


def test_bytes_to_unicode_matches_gpt2_alphabet_from_hf_tokenizers():
    from tokenizers import pre_tokenizers

    phi = ref.bytes_to_unicode()
    assert sorted(phi) == list(range(256)) and len(set(phi.values())) == 256
    assert set(phi.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    assert phi[ord(" ")] == "Ġ" and phi[ord("\n")] == "Ċ" and phi[ord("A")] == "A"


def test_pretokenize_patterns_on_known_splits():
    assert ref.pretokenize("I'm here  now 12345!\n") == ["I", "'m", " here", " ", " now",
                                                          " 12345", "!", "\n"]
    assert ref.pretokenize("I'M 12345", ref.CL100K_PATTERN) == ["I", "'M", " ", "123", "45"]


# --- fast ↔ reference ------------------------------------------------------------------------


def test_fast_training_equals_reference_on_real_text():
    text = corpus()[:20_000]
    for pattern in checks.PATTERNS:
        assert train_merges(text, 80, pattern) == ref.train(text, 336, pattern)


def test_fast_encoding_equals_reference_on_real_text():
    text = corpus()
    tok = Tokenizer.train(text[:30_000], 600)
    sample = text[-4000:]
    assert tok.encode(sample) == ref.encode(sample, tok.merges)
    assert tok.decode(tok.encode(text)) == text


def test_fast_fallback_encoder_equals_tiktoken_path():
    tok = Tokenizer.train(corpus()[:20_000], 500)
    tok_fallback = Tokenizer(tok.merges, tok.pattern, tok.special_tokens)
    tok_fallback._encoding = None  # the path used when two merges spell the same bytes
    sample = corpus()[-3000:]
    assert tok_fallback.encode(sample) == tok.encode(sample) == ref.encode(sample, tok.merges)


TOKENIZER_CHECKS = [c.id for c in all_checks("tokenizer")]


def run_tokenizer_checks(backend, *ids, profile="quick"):
    suite = run_suite(backend, profile=profile, seed=0, area="tokenizer",
                      select=lambda c: c.id in ids)
    return {r.id: r for r in suite.results}


def test_tokenizer_checks_are_registered_for_the_entries():
    assert len(TOKENIZER_CHECKS) == 9
    covered = {e for c in all_checks("tokenizer") for e in c.entries}
    assert {"train", "encode", "decode", "bpe_chunk", "split_special", "byte_tokens",
            "token_bytes", "bytes_to_unicode"} <= covered
    assert checks_for("bpe_chunk") and all(c.area == "tokenizer" for c in checks_for("train"))


@pytest.mark.parametrize("check_id", TOKENIZER_CHECKS)
def test_fast_backend_passes_conformance_check(check_id):
    result = run_tokenizer_checks(FastTokenizerBackend(), check_id, profile="default")[check_id]
    assert result.status == "pass", (result.detail, result.minimal_example)
    assert result.examples > 0 and result.comparisons > 0


def test_a_model_backend_without_a_tokenizer_is_reported_not_implemented():
    class NoTokenizer:
        name, version, device, dtype = "none", "0", "cpu", "float64"
        protocol_version = 2

        def forward(self, tokens, params, config):
            raise NotImplementedError

    results = run_tokenizer_checks(NoTokenizer(), *TOKENIZER_CHECKS)
    assert {r.status for r in results.values()} == {"not-implemented"}


# --- the checks catch planted bugs -----------------------------------------------------------


class Wrapped:
    """A Tokenizer whose encode or decode a planted bug replaces."""

    def __init__(self, tok, encode=None, decode=None):
        self.tok = tok
        self.encode = encode or tok.encode
        self.decode = decode or tok.decode


class Planted(FastTokenizerBackend):
    name = "planted"

    def __init__(self, train=None, encode=None, decode=None):
        self._train, self._encode, self._decode = train, encode, decode

    def train(self, text, vocab_size, pattern):
        merges = super().train(text, vocab_size, pattern)
        return self._train(text, vocab_size, pattern, merges) if self._train else merges

    def build(self, merges, pattern, special_tokens):
        tok = super().build(merges, pattern, special_tokens)
        encode = self._encode and (lambda s, allowed_special=(): self._encode(tok, s,
                                                                               allowed_special))
        decode = self._decode and (lambda ids: self._decode(tok, ids))
        return Wrapped(tok, encode, decode)


class SwappedAlphabet(FastTokenizerBackend):
    """Writes its files in an alphabet with two printable bytes swapped."""

    @staticmethod
    def bytes_to_unicode():
        phi = ref.bytes_to_unicode()
        phi[65], phi[66] = phi[66], phi[65]
        return phi


def first_seen_tie_break(text, vocab_size, pattern, merges):
    """BPE whose ties go to the first pair seen (Python's max over a dict)."""
    chunks = Counter(tuple(c.encode()) for c in ref.pretokenize(text, pattern))
    out = []
    for k in range(vocab_size - 256):
        counts = ref.pair_counts(chunks)
        if not counts:
            break
        pair = max(counts, key=counts.get)
        out.append(pair)
        chunks = Counter({tuple(ref.merge_pair(w, pair, 256 + k)): m for w, m in chunks.items()})
    return out


def leftmost_first(tok, s, allowed_special=()):
    """Apply any merge at the leftmost place it fits, ignoring ranks."""
    ids = []
    for chunk in ref.pretokenize(s, tok.pattern):
        w = list(chunk.encode())
        changed = True
        while changed:
            changed = False
            for j in range(len(w) - 1):
                if (w[j], w[j + 1]) in tok._rank:
                    w[j : j + 2] = [256 + tok._rank[(w[j], w[j + 1])]]
                    changed = True
                    break
        ids += w
    return ids


PLANTED = {
    "train.matches_reference": Planted(train=first_seen_tie_break),
    "bpe_chunk.rank_order": Planted(encode=leftmost_first),
    "encode.matches_reference": Planted(encode=leftmost_first),
    "decode.round_trip": Planted(encode=lambda tok, s, a=(): tok.encode(s.rstrip(" "))),
    "split_special.allowed_and_disallowed": Planted(
        encode=lambda tok, s, a=(): tok.encode_ordinary(s)),
    "decode.out_of_range": Planted(
        decode=lambda tok, ids: tok.decode([i for i in ids if 0 <= i < tok.vocab_size])),
    # byte ids counted from 1, as if token 0 were reserved
    "token_bytes.concatenation": Planted(
        encode=lambda tok, s, a=(): [i + 1 if i < 255 else i for i in tok.encode(s)]),
    "bytes_to_unicode.alphabet": SwappedAlphabet(),
    # bytes that are not UTF-8 dropped instead of replaced by U+FFFD
    "decode.invalid_utf8": Planted(
        decode=lambda tok, ids: tok.decode_bytes(ids).decode("utf-8", errors="ignore")),
}


@pytest.mark.parametrize("check_id", list(PLANTED))
def test_conformance_check_catches_planted_bug(check_id):
    result = run_tokenizer_checks(PLANTED[check_id], check_id, profile="thorough")[check_id]
    assert result.status == "fail", (result.status, result.detail)
    assert result.minimal_example  # the report shows the counterexample


def test_every_check_has_a_planted_bug():
    assert set(PLANTED) == set(TOKENIZER_CHECKS)


# --- the Tokenizer API and its errors ----------------------------------------------------------


def test_byte_level_tokenizer():
    tok = Tokenizer.byte_level()
    assert tok.vocab_size == 256 and tok.eot_token is None
    assert tok.encode("hé") == [104, 195, 169] and tok.decode([104, 195, 169]) == "hé"
    with_eot = Tokenizer.byte_level([ENDOFTEXT])
    assert with_eot.vocab_size == 257 and with_eot.eot_token == 256
    assert with_eot.encode("a<|endoftext|>", allowed_special="all") == [97, 256]
    assert with_eot.encode("a<|endoftext|>", allowed_special=ENDOFTEXT) == [97, 256]
    assert with_eot.encode("", allowed_special="all") == [] == with_eot.encode("")


def test_train_counts_special_tokens_in_the_vocab_size():
    tok = Tokenizer.train(corpus()[:5000], 300)
    assert tok.vocab_size == 300 and len(tok.merges) == 43 and tok.eot_token == 299
    assert Tokenizer.train("ab", 300).vocab_size == 258  # ran out of pairs: one merge


@pytest.mark.parametrize("vocab_size, message", [
    (100, "below 256"), (256, "below 256"), (1 << 30, "absurdly large"), ("9", "integer"),
])
def test_bad_vocab_size(vocab_size, message):
    with pytest.raises(TokenizerError, match=message):
        Tokenizer.train("abc", vocab_size)


def test_bad_pattern_and_bad_input():
    with pytest.raises(TokenizerError, match="does not compile"):
        Tokenizer([], "(unclosed")
    tok = Tokenizer.train(corpus()[:3000], 300)
    with pytest.raises(TokenizerError, match="lone surrogate"):
        tok.encode("ab\ud800")
    with pytest.raises(TokenizerError, match="not in the vocabulary"):
        tok.decode([1, 300])
    with pytest.raises(TokenizerError, match="not in the vocabulary"):
        tok.decode([-1])
    with pytest.raises(TokenizerError, match="unknown special"):
        tok.encode("x", allowed_special={"<|nope|>"})
    with pytest.raises(TokenizerError, match="defined"):
        Tokenizer([(0, 300)])
    with pytest.raises(TokenizerError, match="special token ids"):
        Tokenizer([(97, 98)], special_tokens={ENDOFTEXT: 100})


def test_decode_of_a_cut_character_is_replacement_not_error():
    tok = Tokenizer.byte_level()
    assert tok.decode(list("é".encode())[:1]) == "\ufffd"
    assert ref.decode(list("é".encode())[:1], []) == "\ufffd"


def test_project_file_is_plain_json_with_the_spec_data(tmp_path):
    tok = Tokenizer.train(corpus()[:5000], 300)
    tok.save(tmp_path / "t.json")
    doc = json.loads((tmp_path / "t.json").read_text())
    assert doc["format"] == "gptspec-tokenizer" and doc["version"] == 1
    assert [tuple(m) for m in doc["merges"]] == tok.merges
    assert doc["special_tokens"] == {ENDOFTEXT: 299} and doc["pattern"] == ref.GPT2_PATTERN


def test_merges_that_spell_the_same_bytes(tmp_path):
    # (aa, a) and (a, aa) both spell "aaa": tiktoken cannot hold them, the fallback can
    merges = [(97, 97), (256, 97), (97, 256)]
    tok = Tokenizer(merges)
    for s in ("aaa", "aaaa", "aaaaa a aa"):
        assert tok.encode(s) == ref.encode(s, merges)
        assert tok.decode(tok.encode(s)) == s
    for fmt in ("tiktoken", "hf"):
        with pytest.raises(TokenizerError, match="same bytes"):
            tok.save(tmp_path / f"t.{fmt}", fmt)
        assert not (tmp_path / f"t.{fmt}").exists()
    tok.save(tmp_path / "t.json")
    assert Tokenizer.load(tmp_path / "t.json").merges == merges



@settings(max_examples=300, deadline=None)
@given(st.data())
def test_exact_encoder_equals_reference_on_any_merges(data):
    # any valid merges: ones BPE would not learn, two merges spelling the same bytes
    merges = data.draw(any_merges(alphabet=b"ab c"))
    texts = data.draw(st.lists(spelled_texts(merges, alphabet=b"ab c"), max_size=4))
    rank = {pair: k for k, pair in enumerate(merges)}
    tok = Tokenizer(merges)
    tok._encoding = None  # the exact path, whatever tiktoken would do with these merges
    for text in texts:
        assert bpe_lowest_rank_first(list(text.encode()), rank) == ref.bpe_chunk(
            text.encode(), merges)
        assert tok.encode(text) == ref.encode(text, merges)



def test_merges_byte_ranked_bpe_would_not_make_encode_as_the_spec(tmp_path):
    # "abc" is token 258 = (a, bc); byte ranks join ab (256) first and then spell abc
    # as 258, the spec's pair ranks find no merge (ab, c): [256, 99]
    merges = [(97, 98), (98, 99), (97, 257)]
    tok = Tokenizer(merges)
    assert tok.encode("abc") == ref.encode("abc", merges) == [256, 99]
    assert tok.encode("xabc abcabc") == ref.encode("xabc abcabc", merges)
    assert not merges_follow_byte_ranks(tok._vocab, merges)
    (tmp_path / "t.json").write_text(json.dumps({
        "format": "gptspec-tokenizer", "version": 1, "pattern": "gpt2",
        "base": list(range(256)), "merges": merges, "special_tokens": {}}))
    assert Tokenizer.load(tmp_path / "t.json").encode("abc") == [256, 99]
    # tiktoken's ranks would bring back (ab, c) in place of (a, bc): refused
    with pytest.raises(TokenizerError, match="byte-ranked BPE"):
        tok.save(tmp_path / "t.tiktoken", "tiktoken")
    assert not (tmp_path / "t.tiktoken").exists()


def test_learned_merges_keep_tiktoken():
    tok = Tokenizer.train(corpus()[:20_000], 500)
    assert tok._encoding is not None
    assert merges_follow_byte_ranks(tok._vocab, tok.merges)
    assert not merges_follow_byte_ranks(tok._vocab, tok.merges, max_work=10)  # too costly


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_fast_encoder_equals_reference_on_any_merges(data):
    # whichever path the tokenizer picks for them (tiktoken or the exact one)
    merges = data.draw(any_merges(alphabet=b"ab c"))
    tok = Tokenizer(merges)
    for text in data.draw(st.lists(spelled_texts(merges, alphabet=b"ab c"), max_size=4)):
        assert tok.encode(text) == ref.encode(text, merges), (merges, text)


def test_merges_that_spell_the_same_bytes_encode_a_long_run_in_linear_time():
    # they keep tiktoken out; the exact path rescanned the chunk after every merge
    # (10 000 'a' took 13 s, 40 000 several minutes)
    merges = [(97, 97), (256, 97), (97, 256)]
    tok = Tokenizer(merges)
    assert tok.encode("a" * 3001) == ref.encode("a" * 3001, merges)
    started = time.perf_counter()
    assert tok.encode("a" * 40_000) == [256] * 20_000
    assert time.perf_counter() - started < 10  # 0.3 s here


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(st.characters(exclude_categories=["Cs"]), max_size=60) | small_texts()
                | st.sampled_from(["it's  x", "a \n b", "x  ", "  ", "1,000 ", "ab.  c"]),
                min_size=1, max_size=40),
       st.integers(2, 8), st.sampled_from(checks.PATTERNS))
def test_threaded_encoding_cuts_only_where_every_chunking_agrees(parts, n_threads, pattern):
    text = "".join(parts)
    tok = Tokenizer(ref.train(corpus()[:2000], 300, pattern), pattern)
    assert tok.encode_ordinary(text, n_threads, min_piece=4) == tok.encode_ordinary(text)
    pieces = split_for_threads(text, n_threads)
    assert "".join(pieces) == text
    chunks = ref.pretokenize(text, pattern)
    assert [c for p in pieces for c in ref.pretokenize(p, pattern)] == chunks


def test_threaded_encoding_of_a_long_text():
    text = corpus() * 2
    tok = Tokenizer.train(text[:20_000], 400)
    assert tok.encode(text, num_threads=4) == tok.encode(text)
    assert len(split_for_threads(text, 4)) == 4


def test_white_space_is_what_the_patterns_call_whitespace():
    every = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    assert [ord(c) for c in regex.findall(r"\s", every)] == sorted(WHITE_SPACE)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(st.characters(exclude_categories=["Cs"]), max_size=20)
                | st.text(" \t\n\r\x0b\x0c\x85\xa0\u2000\u3000\x1cab1.'!", max_size=20),
                min_size=1, max_size=20))
def test_lookahead_free_pattern_on_cut_pieces_gives_gpt2_chunks(parts):
    text = "".join(parts)
    pieces = cut_whitespace_runs(text)
    assert "".join(pieces) == text
    chunks = [c for p in pieces for c in regex.findall(GPT2_NO_LOOKAHEAD, p)]
    assert chunks == ref.pretokenize(text, ref.GPT2_PATTERN)


def test_the_cut_is_needed():
    # without it the lookahead-free pattern keeps a whole run of spaces in one chunk
    assert regex.findall(GPT2_NO_LOOKAHEAD, "a   b") == ["a", "   ", "b"]
    assert ref.pretokenize("a   b") == ["a", "  ", " b"]
    assert cut_whitespace_runs("a   b\n\nc  ") == ["a  ", " b\n", "\nc  "]


def hf_trained(tmp_path, special_tokens):
    from tokenizers import Regex, pre_tokenizers, trainers
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.models import BPE

    hf = HFTokenizer(BPE())
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(ref.GPT2_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    trainer = trainers.BpeTrainer(vocab_size=600, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=special_tokens)
    hf.train_from_iterator([corpus()], trainer)
    path = tmp_path / "tokenizer.json"
    hf.save(str(path))
    return hf, path


def test_tokenizer_json_written_by_hf_tokenizers_loads_and_encodes_alike(tmp_path):
    hf, path = hf_trained(tmp_path, [])
    tok = Tokenizer.load(path)
    assert tok.vocab_size == hf.get_vocab_size() == 600
    assert tok.base != tuple(range(256))  # HF numbers the bytes in its own order
    sample = corpus()[-5000:] + "naïve 😀 中文"
    assert tok.encode(sample) == hf.encode(sample).ids
    assert tok.encode(sample) == ref.encode(sample, tok.merges, base=tok.base)


def test_tokenizer_json_with_special_tokens_first_is_a_clear_error(tmp_path):
    from gptspec.fast.tokenizer_files import TokenizerFileError

    _, path = hf_trained(tmp_path, [ENDOFTEXT])
    with pytest.raises(TokenizerFileError, match=r"special tokens after them \(special tokens at"):
        Tokenizer.load(path)
    doc = json.loads(path.read_text())
    doc["normalizer"] = {"type": "NFC"}
    path.write_text(json.dumps(doc))
    with pytest.raises(TokenizerFileError, match="normalizer"):
        Tokenizer.load(path)


@pytest.mark.parametrize("pattern", [".", r"[^H]", r"\w+"])
def test_a_pattern_that_skips_the_sample_text_says_the_text_is_the_samples(pattern):
    # the line said "skips text (first at character 0: 'Hello, world')": the probe's
    # characters, read as the user's data (issue 29)
    with pytest.raises(TokenizerError) as caught:
        Tokenizer([], pattern)
    line = str(caught.value)
    assert "on the sample text gptspec tries every pattern on ('Hello, world!'…)" in line
    assert "no match covers character" in line and "first at" not in line


def test_a_pattern_that_skips_the_training_text_names_the_text_skipped():
    # the skipped text alone, not what follows it ('\x07cd' was named)
    with pytest.raises(TokenizerError, match=r"in the training text no match covers "
                                             r"'\\x07';"):
        Tokenizer.train("ab\x07cd", 260, pattern="[^\x07]")
    with pytest.raises(TokenizerError, match="no match covers '€';"):
        Tokenizer.train("price 5€ ok\n", 260, pattern="(?s)[^€]+")
