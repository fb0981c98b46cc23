"""Tokenizer benchmark: encode throughput and training time, side by side in one run.

Contenders: the reference (literal, slow), the fast path, tiktoken (single thread), and
HF tokenizers (its BpeTrainer for training; its BPE model, read from our tokenizer.json,
for encoding). Every encoder works with the same vocabulary; every trainer learns the
same number of merges from the same text. Goals from the issue: fast encoding ≥ tiktoken,
fast training ≥ 20× the reference on 1 MB, and within 5× of HF's BpeTrainer.

The corpus is ``--corpus PATH`` (or the environment variable GPTSPEC_CORPUS); by
default the .py files of Python's standard library. When GPT-2's ranks are in
.cache/gpt2/gpt2.tiktoken (the tests fetch them) encoding is timed with them too.

    python -m benchmarks.tokenizer --corpus PATH/TO/tinyshakespeare.txt
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sysconfig
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # HF encode: one thread

import tiktoken  # noqa: E402
from tokenizers import Regex, pre_tokenizers, trainers  # noqa: E402
from tokenizers import Tokenizer as HFTokenizer  # noqa: E402
from tokenizers.models import BPE  # noqa: E402

from benchmarks.report import Report, median_seconds
from gptspec.fast.tokenizer import (  # noqa: E402
    GPT2_PATTERN,
    PARALLEL_MIN_PIECE,
    Tokenizer,
    train_merges,
)
from gptspec.reference import tokenizer as ref  # noqa: E402

GROUP = "tokenizer"
GPT2_RANKS = Path(__file__).resolve().parent.parent / ".cache" / "gpt2" / "gpt2.tiktoken"


def default_corpus(size: int) -> str:
    """The standard library's .py files, in name order, until ``size`` bytes."""
    parts, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        parts.append(text)
        total += len(text.encode())
        if total >= size:
            break
    return "".join(parts)


def load_corpus(path: str | None, size: int) -> tuple[str, str]:
    path = path or os.environ.get("GPTSPEC_CORPUS")
    if path:
        return Path(path).read_text(encoding="utf-8"), str(path)
    return default_corpus(size), "Python standard library .py files"


def first_megabytes(text: str, n_bytes: int) -> str:
    return text.encode("utf-8")[:n_bytes].decode("utf-8", errors="ignore")


def hf_trainer_tokenizer(pattern: str) -> HFTokenizer:
    tok = HFTokenizer(BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    return tok


def bench_training(report: Report, text: str, vocab_size: int, quick: bool) -> Tokenizer:
    mb = len(text.encode()) / 1e6
    n_merges = vocab_size - 256
    note = f"{mb:.2f} MB, {n_merges} merges"
    merges: list = []

    def fast() -> None:
        merges[:] = train_merges(text, n_merges, GPT2_PATTERN)

    t_fast = report.metric(GROUP, "training time / fast", median_seconds(fast, repeats=3),
                           "s", note)

    def hf() -> None:
        tok = hf_trainer_tokenizer(GPT2_PATTERN)
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator([text], trainer)

    threads = os.environ.get("TOKENIZERS_PARALLELISM")
    t_hf = report.metric(GROUP, "training time / HF BpeTrainer", median_seconds(hf, repeats=3),
                         "s", note + f"; TOKENIZERS_PARALLELISM={threads}")
    reference_merges: list = []

    def reference() -> None:
        reference_merges[:] = ref.train(text, vocab_size, GPT2_PATTERN)

    t_ref = report.metric(GROUP, "training time / reference",
                          median_seconds(reference, repeats=1, warmup=0), "s", note)
    assert reference_merges == merges, "fast and reference training disagree"
    report.ratio(GROUP, "training speed: fast / reference", t_ref / t_fast, 20.0, "≥ 20×")
    report.ratio(GROUP, "training speed: fast / HF BpeTrainer", t_hf / t_fast, 0.2,
                 "≥ 0.2 (within 5×)")
    return Tokenizer(merges, GPT2_PATTERN, {})


def interleaved(fns: list, rounds: int) -> list[list[float]]:
    """Time each function once per round, back to back, rotating which goes first, so
    that all see the same machine load: times[round][i] is fns[i]'s time."""
    for fn in fns:
        fn()  # warm up
    times = []
    for r in range(rounds):
        order = [(r + i) % len(fns) for i in range(len(fns))]
        this = [0.0] * len(fns)
        for i in order:
            t0 = time.perf_counter()
            fns[i]()
            this[i] = time.perf_counter() - t0
        times.append(this)
    return times


def bench_encoding(report: Report, tok: Tokenizer, text: str, label: str,
                   reference_slice: int) -> None:
    mb = len(text.encode()) / 1e6
    encoding = tiktoken.Encoding(f"bench-{label}", pat_str=tok.pattern,
                                 mergeable_ranks=tok.mergeable_ranks(), special_tokens={})
    with tempfile.TemporaryDirectory() as tmp:
        tok.save(Path(tmp) / "tokenizer.json", "hf")
        hf = HFTokenizer.from_file(str(Path(tmp) / "tokenizer.json"))
    expected = encoding.encode_ordinary(text)
    assert tok.encode(text) == expected and hf.encode(text).ids == expected

    def throughput(name: str, fn, size_mb: float = mb, repeats: int = 5) -> float:
        seconds = median_seconds(fn, repeats=repeats)
        return report.metric(GROUP, f"encode throughput ({label}) / {name}", size_mb / seconds,
                             "MB/s", f"{size_mb:.3f} MB")

    # fast (one thread, and several where the text is long enough to be cut) and tiktoken
    # alternate, so that all see the same machine load; a ratio is the median of the
    # ratios within each round
    threads = os.cpu_count() or 1
    contenders = {"fast (1 thread)": lambda: tok.encode(text)}
    if threads > 1 and len(text) >= 2 * PARALLEL_MIN_PIECE:
        assert tok.encode(text, num_threads=threads) == expected
        contenders[f"fast ({threads} threads)"] = lambda: tok.encode(text, num_threads=threads)
    contenders["tiktoken (1 thread)"] = lambda: encoding.encode_ordinary(text)
    rounds = interleaved(list(contenders.values()), 9)
    for i, name in enumerate(contenders):
        t = statistics.median(r[i] for r in rounds)
        report.metric(GROUP, f"encode throughput ({label}) / {name}", mb / t, "MB/s",
                      f"{mb:.3f} MB")
    for i, name in enumerate(list(contenders)[:-1]):
        report.ratio(GROUP, f"encode throughput ({label}): {name} / tiktoken (1 thread)",
                     statistics.median(r[-1] / r[i] for r in rounds), 1.0, "≥ 1×")
    throughput("HF tokenizers", lambda: hf.encode(text))
    piece = first_megabytes(text, reference_slice)
    rank = {pair: k for k, pair in enumerate(tok.merges)}

    def reference() -> None:
        for chunk in ref.pretokenize(piece, tok.pattern):
            ref.bpe_chunk(chunk.encode(), rank, tok.base)

    throughput("reference", reference, len(piece.encode()) / 1e6, repeats=1)


def run(report: Report, quick: bool, corpus: str | None = None) -> None:
    text, source = load_corpus(corpus, 2_000_000)
    train_text = first_megabytes(text, 100_000 if quick else 1_000_000)
    vocab_size = 512 if quick else 1024
    report.metric(GROUP, "corpus", len(text.encode()) / 1e6, "MB", source)
    tok = bench_training(report, train_text, vocab_size, quick)
    encode_text = first_megabytes(text, 200_000) if quick else text
    bench_encoding(report, tok, encode_text, f"trained, V={vocab_size}",
                   5_000 if quick else 20_000)
    if GPT2_RANKS.exists():
        bench_encoding(report, Tokenizer.load(GPT2_RANKS), encode_text, "GPT-2",
                       2_000 if quick else 10_000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=None, help="UTF-8 text (default: GPTSPEC_CORPUS "
                                                       "or the standard library's .py files)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = parser.parse_args()
    report = Report()
    run(report, args.quick, args.corpus)
    for m in report.metrics:
        print(f"{m.name:55s} {m.value:10.3f} {m.unit:5s} {m.note}")
    for r in report.ratios:
        verdict = {True: "met", False: "NOT met", None: ""}[r.met]
        print(f"{r.name:55s} {r.value:10.2f}  goal {r.goal_text:18s} {verdict}")
    if args.json:
        args.json.write_text(json.dumps(report.to_dict(), indent=1))


if __name__ == "__main__":
    main()
