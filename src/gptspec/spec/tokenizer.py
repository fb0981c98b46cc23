"""Spec entries: the byte-level BPE tokenizer, text → tokens → text.

The documents name byte pair encoding and stop there, and training (learning merges)
does not by itself define the map from text to tokens. These entries define both:
training, then *encode*, which applies the learned merges in rank order inside the
chunks of a pre-tokenization regex. Each entry's meaning is its decorated function:
short Python (sympy integers where a count is computed), written independently of
``gptspec.reference.tokenizer``; the tests evaluate both on random inputs. The one-hot
encoding that comes next is the embedding group's ``one_hot``. Notation: a chunk is
w = (w_1, …, w_n); merges m_k = (a_k, b_k) create token 256 + k, k the merge's rank.
"""

from __future__ import annotations

import regex
import sympy as sp

from gptspec.spec.equation import Decision, Reading, Symbol, equation
from gptspec.spec.sources import NOTES, POST, RADFORD_2019, SENNRICH_2016, UNICODE_15, Source

GPT2_PATTERN = (
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
)
CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)

_BYTE_LEVEL = Decision(
    question="What are the symbols BPE starts from?",
    readings=(
        Reading(Source(SENNRICH_2016, "sec. 3.2"),
                "characters of words, with an end-of-word marker"),
        Reading(Source(RADFORD_2019, "sec. 2.2"),
                "the 256 byte values of the UTF-8 text (byte-level BPE)"),
        Reading(Source(NOTES, "sec. 1.2"), "a BPE vocabulary, without fixing its base symbols"),
    ),
    decision="The 256 bytes. Every string is encodable, no unknown token exists.",
    why="GPT-2 and GPT-3, which the documents describe, use byte-level BPE.",
)


@equation(
    id="byte_tokens",
    title="Base vocabulary: the 256 bytes",
    group="tokenizer",
    latex=r"\mathcal{V}_0 = \{0, 1, \dots, 255\},\qquad \operatorname{bytes}(i) = \beta_i",
    symbols=(Symbol(r"\beta", "(256,)", "the byte of each base token: a permutation of "
                    "0…255, the identity for tokenizers trained here"),
             Symbol(r"\mathcal{V}_0", "(256,)", "the base vocabulary: one token per byte value")),
    sources=(Source(RADFORD_2019, "sec. 2.2"), Source(NOTES, "sec. 1.2")),
    reference="byte_tokens",
    decisions=(_BYTE_LEVEL,),
    notes="GPT-2's files number the byte tokens in another order (token 0 is '!'); "
          "that order is the permutation β, and nothing else changes.",
)
def byte_tokens(beta=tuple(range(256))):
    assert sorted(beta) == list(range(256))
    return [bytes([beta[i]]) for i in range(256)]


@equation(
    id="pretokenize",
    title="Pre-tokenization",
    group="tokenizer",
    latex=r"\operatorname{chunks}(s) = (s_{[p_0, p_1)}, s_{[p_1, p_2)}, \dots),\quad "
          r"s_{[p_i, p_{i+1})} = \text{the leftmost match of } P \text{ at } p_i",
    symbols=(Symbol("s", "()", "the text, a string of Unicode code points"),
             Symbol("P", "()", "the pattern: GPT-2's (default) or the cl100k-style one"),
             Symbol("p_i", "()", "where chunk i starts in s; p_0 = 0")),
    sources=(Source(RADFORD_2019, "sec. 2.2"), Source(POST, "discussion")),
    reference="pretokenize",
    decisions=(Decision(
        question="Which pattern splits the text before BPE?",
        readings=(
            Reading(Source(RADFORD_2019, "sec. 2.2"),
                    "GPT-2's regex: contractions, ' ?' + letters, ' ?' + digits, ' ?' + "
                    "other symbols, whitespace"),
            Reading(Source(POST, "discussion"),
                    "the discussion asks what the regex does; the Notes omit it"),
        ),
        decision="GPT-2's pattern by default; the cl100k-style pattern (digits in groups "
                 "of ≤ 3, case-insensitive contractions) as an option.",
        why="GPT-2 is the model the documents describe; its vocabulary is the one "
            "anyone can check against.",
    ),),
    notes="GPT-2's pattern, in the `regex` module's syntax (\\p{L} letters, \\p{N} "
          "numbers):\n\n    " + GPT2_PATTERN + "\n\nThe cl100k-style pattern:\n\n    "
          + CL100K_PATTERN + "\n\nMerges never cross a chunk boundary, so a word keeps "
          "its tokens wherever it appears after a space.",
)
def pretokenize(s, P=GPT2_PATTERN):
    chunks, p = [], 0
    while p < len(s):
        m = regex.compile(P).match(s, p)  # the leftmost match starting at p
        chunks.append(m.group())
        p = m.end()
    return chunks


@equation(
    id="pair_counts",
    title="Pair counts",
    group="tokenizer",
    latex=r"c(a, b) = \sum_{w} \operatorname{mult}(w)\,"
          r"\bigl|\{\, j : (w_j, w_{j+1}) = (a, b) \,\}\bigr|",
    symbols=(Symbol("w", "(n,)", "a distinct chunk, as token ids"),
             Symbol(r"\operatorname{mult}(w)", "()", "how often w occurs in the text"),
             Symbol("c(a, b)", "()", "how often token a is directly followed by token b, over "
                    "the text")),
    sources=(Source(SENNRICH_2016, "sec. 3.2, Algorithm 1"),),
    reference="pair_counts",
    notes="Overlapping occurrences count: (a, a) occurs twice in (a, a, a), though only "
          "one of them can be merged.",
)
def pair_counts(chunks):
    pairs = {(w[j], w[j + 1]) for w in chunks for j in range(len(w) - 1)}
    return {
        (a, b): sp.Add(*[sp.Integer(m) for w, m in chunks.items()
                         for j in range(len(w) - 1) if (w[j], w[j + 1]) == (a, b)])
        for (a, b) in pairs
    }


@equation(
    id="best_pair",
    title="The merge chosen at each step, and its tie-break",
    group="tokenizer",
    latex=r"m_k = \min_{\text{lex}} \operatorname*{arg\,max}_{(a,b)\,:\,c(a,b) > 0} c(a, b)",
    symbols=(Symbol("c", "()", "the pair counts after merges m_0 … m_{k-1}"),
             Symbol("(a, b)", "(2,)", "a pair of adjacent token ids"),
             Symbol("m_k", "(2,)", "merge k: the pair chosen, ties to the smallest")),
    sources=(Source(SENNRICH_2016, "Algorithm 1"),),
    reference="best_pair",
    decisions=(Decision(
        question="Which pair is merged when several have the largest count?",
        readings=(
            Reading(Source(SENNRICH_2016, "Algorithm 1"),
                    "max over a dictionary: the tie goes to whichever pair the dictionary "
                    "yields first, i.e. it is left unspecified"),
            Reading(Source(NOTES, "sec. 1.2"), "merge a most frequent pair; no tie-break given"),
        ),
        decision="The smallest pair (a, b) in lexicographic order of the token ids "
                 "(compare a, then b).",
        why="It depends only on the counts, not on the order of the text or of a hash "
            "table, so any implementation can reproduce it exactly.",
    ),),
    notes="Training stops early, with fewer merges than asked for, when no pair occurs "
          "any more (every chunk is a single token).",
)
def best_pair(c):
    occurring = sorted((-count, pair) for pair, count in c.items() if count > 0)
    return occurring[0][1] if occurring else None


@equation(
    id="merge_pair",
    title="Applying a merge",
    group="tokenizer",
    latex=r"\mu_{(a,b)\to t}(w) = \begin{cases} (t)\,\Vert\,\mu(w_{3:}) & w_1 = a,\ w_2 = b "
          r"\\ (w_1)\,\Vert\,\mu(w_{2:}) & \text{otherwise} \end{cases}",
    symbols=(Symbol("w", "(n,)", "token ids"), Symbol("t", "()", "the new token"),
             Symbol("(a, b)", "(2,)", "the pair merged"),
             Symbol(r"\mu", "(n,) → (m,)", "the merge, applied left to right without overlap")),
    sources=(Source(SENNRICH_2016, "Algorithm 1"),),
    reference="merge_pair",
    notes="Left to right, without overlaps: (a, a, a) becomes (t, a).",
)
def merge_pair(w, pair, t):
    def mu(w):
        if len(w) < 2:
            return list(w)
        if (w[0], w[1]) == tuple(pair):
            return [t] + mu(w[2:])
        return [w[0]] + mu(w[1:])

    return mu(list(w))


@equation(
    id="train",
    title="BPE training",
    group="tokenizer",
    latex=r"W^{(0)} = \operatorname{bytes}(\operatorname{chunks}(s)),\quad "
          r"m_k = \operatorname{best}(c_{W^{(k)}}),\quad "
          r"W^{(k+1)} = \mu_{m_k \to 256 + k}(W^{(k)}),\quad k < V - 256",
    symbols=(Symbol("s", "()", "the training text"),
             Symbol("V", "()", "the vocabulary size asked for (≥ 256)"),
             Symbol("W^{(k)}", "chunks", "the text's distinct chunks as token ids, after k merges"),
             Symbol("c", "()", "the pair counts (pair_counts)"),
             Symbol("k", "()", "the merge's number, from 0: its new token is 256 + k"),
             Symbol("m_k", "(2,)", "merge k (best_pair)"),
             Symbol(r"\mu", "(n,) → (m,)", "one merge applied to every chunk (merge_pair)")),
    sources=(Source(SENNRICH_2016, "Algorithm 1"), Source(RADFORD_2019, "sec. 2.2"),
             Source(NOTES, "sec. 1.2")),
    reference="train",
    notes="Special tokens' text is cut out of the training text first, so no merge "
          "spans one. The result is the ordered list of merges; a merge's index is its "
          "rank in encoding.",
)
def train(s, V, P=GPT2_PATTERN):
    W = [list(chunk.encode("utf-8")) for chunk in pretokenize.sympy(s, P)]
    merges = []
    for k in range(V - 256):
        counts = pair_counts.sympy({tuple(w): sum(1 for v in W if v == w) for w in W})
        m = best_pair.sympy(counts)
        if m is None:
            break
        merges.append(m)
        W = [merge_pair.sympy(w, m, 256 + k) for w in W]
    return merges


@equation(
    id="token_bytes",
    title="The bytes of a token",
    group="tokenizer",
    latex=r"m_k = (a_k, b_k):\quad \operatorname{bytes}(256 + k) = "
          r"\operatorname{bytes}(a_k)\,\Vert\,"
          r"\operatorname{bytes}(b_k)",
    symbols=(Symbol("m_k", "()", "merge k = (a_k, b_k)"),
             Symbol("a_k, b_k", "()", "the two token ids merge k joins"),
             Symbol("k", "()", "the merge's number, from 0: its token is 256 + k")),
    sources=(Source(SENNRICH_2016, "sec. 3.2"),),
    reference="token_bytes",
)
def token_bytes(merges, beta=tuple(range(256))):
    def of(i):
        return bytes([beta[i]]) if i < 256 else of(merges[i - 256][0]) + of(merges[i - 256][1])

    return [of(i) for i in range(256 + len(merges))]


@equation(
    id="bpe_chunk",
    title="Encoding a chunk: merges applied by rank",
    group="tokenizer",
    latex=r"w \leftarrow \mu_{m_k \to 256+k}^{\text{leftmost}}(w),\quad "
          r"k = \min\{\, k : m_k = (w_j, w_{j+1}) \text{ for some } j \,\}, "
          r"\text{ until no adjacent pair is a merge}",
    symbols=(Symbol("w", "(n,)", "the chunk's tokens, starting as its bytes"),
             Symbol("m_k", "(2,)", "merge k of the trained merges"),
             Symbol(r"\mu", "(n,) → (m,)", "one merge, here at the leftmost place it applies")),
    sources=(Source(POST, "discussion: the encode step"), Source(RADFORD_2019, "sec. 2.2")),
    reference="bpe_chunk",
    decisions=(Decision(
        question="What is the rank of an adjacent pair during encoding?",
        readings=(
            Reading(Source(RADFORD_2019, "sec. 2.2"),
                    "GPT-2's encoder: the line number of the pair (a, b) in merges.txt; "
                    "pairs not listed are never merged"),
            Reading(Source(POST, "discussion"),
                    "the discussion: save the merge rules in order and apply them"),
        ),
        decision="The index k of the merge (a, b) in the learned list. (tiktoken instead "
                 "ranks a pair by the rank of the token whose bytes are bytes(a) ‖ "
                 "bytes(b); on merges learned by BPE the two agree, which the "
                 "conformance checks test on GPT-2's vocabulary and on trained ones.)",
        why="It is what training learned, and it needs nothing but the merge list.",
    ),),
    notes="Replacing only the leftmost occurrence, then looking again, gives the same "
          "result as replacing every occurrence of the lowest-ranked pair at once: the "
          "new token can only form pairs of higher rank.",
)
def bpe_chunk(chunk, merges, beta=tuple(range(256))):
    w = [beta.index(byte) for byte in chunk]
    while True:
        ranks = [merges.index(p) for p in zip(w, w[1:], strict=False) if p in merges]
        if not ranks:
            return w
        k = min(ranks)
        j = list(zip(w, w[1:], strict=False)).index(merges[k])
        w = w[:j] + [256 + k] + w[j + 2:]


@equation(
    id="split_special",
    title="Special tokens",
    group="tokenizer",
    latex=r"s = u_0\,\sigma_1\,u_1 \cdots \sigma_r\,u_r \;\mapsto\; "
          r"(u_0, \operatorname{id}(\sigma_1), u_1, \dots),\quad \sigma_i \in A",
    symbols=(Symbol("A", "()", "the allowed special tokens, e.g. <|endoftext|> = 50256 "
                    "in GPT-2"),
             Symbol("s", "()", "the text"),
             Symbol(r"\sigma_i", "()", "the i-th allowed special token found in s"),
             Symbol("u_i", "()", "the ordinary text around them (possibly empty)"),
             Symbol("r", "()", "the number of special tokens found")),
    sources=(Source(RADFORD_2019, "sec. 2.1"),),
    reference="split_special",
    decisions=(Decision(
        question="What happens to special-token text that the caller did not allow?",
        readings=(
            Reading(Source(RADFORD_2019, "sec. 2.2"),
                    "GPT-2's vocabulary ends with <|endoftext|>; how text containing it is "
                    "encoded is not stated"),
        ),
        decision="It is an error naming the token. Allowed ones become their id; the "
                 "longest wins where several start at one place.",
        why="Text from a user that happens to contain '<|endoftext|>' must not silently "
            "end a document, nor silently become ordinary tokens.",
    ),),
)
def split_special(s, special_tokens, allowed):
    for sigma in special_tokens:
        if sigma in s and sigma not in allowed:
            raise ValueError(sigma)
    for p in range(len(s)):
        starting = sorted((sigma for sigma in allowed if s.startswith(sigma, p)), key=len)
        if starting:
            sigma = starting[-1]
            head = [s[:p]] if p else []
            return head + [special_tokens[sigma]] + split_special.sympy(
                s[p + len(sigma):], special_tokens, allowed)
    return [s] if s else []


@equation(
    id="encode",
    title="Encode: text → tokens",
    group="tokenizer",
    latex=r"\operatorname{encode}(s) = \mathop{\Vert}_{u\text{ or }\sigma}\;"
          r"\begin{cases}\operatorname{id}(\sigma) \\ \mathop{\Vert}_{x \in "
          r"\operatorname{chunks}(u)} \operatorname{bpe}(\operatorname{utf8}(x))\end{cases}",
    symbols=(Symbol("s", "()", "the text"),
             Symbol("u", "()", "a piece of ordinary text (split_special)"),
             Symbol(r"\sigma", "()", "an allowed special token (split_special)"),
             Symbol("x", "()", "a chunk of u (pretokenize)")),
    sources=(Source(POST, "discussion: the encode step"), Source(NOTES, "sec. 1.2"),
             Source(RADFORD_2019, "sec. 2.2")),
    reference="encode",
    notes="The token sequence is then one-hot encoded (entry `one_hot`, embedding group).",
)
def encode(s, merges, P=GPT2_PATTERN, special_tokens=None, allowed=()):
    tokens = []
    for part in split_special.sympy(s, special_tokens or {}, allowed):
        if isinstance(part, int):
            tokens.append(part)
        else:
            for x in pretokenize.sympy(part, P):
                tokens += bpe_chunk.sympy(x.encode("utf-8"), merges)
    return tokens


@equation(
    id="decode",
    title="Decode: tokens → text",
    group="tokenizer",
    latex=r"\operatorname{decode}(x_1, \dots, x_T) = \operatorname{utf8}^{-1}\bigl("
          r"\operatorname{bytes}(x_1) \Vert \cdots \Vert \operatorname{bytes}(x_T)\bigr)",
    symbols=(Symbol("x_t", "()", "token ids"),),
    sources=(Source(NOTES, "sec. 1.2"), Source(RADFORD_2019, "sec. 2.2")),
    reference="decode",
    decisions=(Decision(
        question="What text do token ids give whose bytes are not UTF-8?",
        readings=(
            Reading(Source(NOTES, "sec. 1.2"),
                    "decoding is the inverse of encoding: defined on what encode produces, "
                    "silent on other token sequences"),
            Reading(Source(RADFORD_2019, "sec. 2.2"),
                    "byte-level BPE: any byte sequence is a token sequence, so some token "
                    "sequences (a character cut between two tokens) spell no text"),
            Reading(Source(UNICODE_15, "sec. 3.9, U+FFFD Substitution of Maximal Subparts"),
                    "a decoder may replace ill-formed subsequences by U+FFFD; the recommended "
                    "practice replaces each maximal subpart by one U+FFFD"),
        ),
        decision="Every well-formed character is kept, and each maximal subpart of an "
                 "ill-formed subsequence becomes one U+FFFD: scanning left to right, where "
                 "no well-formed sequence (Table 3-7) continues, the longest prefix of one "
                 "that was read is replaced, or the single byte where none can start "
                 "(80–BF alone, C0, C1, F5–FF). Python's bytes.decode('utf-8', "
                 "errors='replace') is exactly this. So E4 B8 (a character cut short, "
                 "also at the end) gives one U+FFFD; C0 80 (overlong) two; ED A0 80 (an "
                 "encoded surrogate) three; F4 90 80 80 (above U+10FFFF) four. Not one "
                 "U+FFFD per byte, not dropping the bytes, not an error, not surrogate "
                 "escapes.",
        why="Generation stops wherever the token limit falls, often inside a character: "
            "decoding must not fail. Replacing rather than dropping keeps the damage "
            "visible; the maximal-subpart count is the Unicode Standard's recommended "
            "practice and what Python's and the WHATWG Encoding Standard's UTF-8 decoders "
            "do, so the text is the same whichever decoder a user reaches for.",
    ),),
    notes="decode(encode(s)) = s for every string s. An id outside the vocabulary is an "
          "error. Byte sequences that are not UTF-8 decode as the decision says; "
          "tokens are concatenated before decoding, so a character split across two "
          "tokens decodes whole.",
)
def decode(x, merges, special_tokens=None):
    vocab = dict(enumerate(token_bytes.sympy(merges)))
    vocab.update({i: sigma.encode("utf-8") for sigma, i in (special_tokens or {}).items()})
    return b"".join(vocab[t] for t in x).decode("utf-8", errors="replace")


@equation(
    id="bytes_to_unicode",
    title="GPT-2's printable byte alphabet (an interop detail)",
    group="tokenizer",
    latex=r"\phi(b) = \begin{cases} \operatorname{chr}(b) & b \in [33, 126] \cup "
          r"[161, 172] \cup [174, 255] \\ \operatorname{chr}(256 + |\{b' < b : b' "
          r"\text{ not printable}\}|) & \text{otherwise}\end{cases}",
    symbols=(Symbol("b", "()", "a byte value"),
             Symbol(r"\phi", "() → ()", "the printable character that stands for byte b")),
    sources=(Source(RADFORD_2019, "sec. 2.2"),),
    reference="bytes_to_unicode",
    notes="Not part of the map from text to tokens. GPT-2's vocab.json and merges.txt, "
          "and HF tokenizers' tokenizer.json, store byte strings as text by writing "
          "each byte b as the character φ(b), so that space (32) appears as 'Ġ' "
          "(chr(288)). It is a bijection; reading such a file means applying φ⁻¹.",
)
def bytes_to_unicode():
    printable = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255]
    rest = [b for b in range(256) if b not in printable]
    return {b: chr(b) if b in printable else chr(256 + rest.index(b)) for b in range(256)}
