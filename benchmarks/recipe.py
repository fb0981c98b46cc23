"""Training at the nanoGPT shakespeare-char recipe: ``gptspec train`` against a plain,
idiomatic PyTorch loop of the same model and recipe (benchmarks/plain_gpt.py).

Each contender is a fresh process on the same token ids (the corpus's bytes) with the
same settings and number of steps, at 1 and at 2 threads; the two alternate, the first
one changing with each round, so a change in the machine's load falls on both. Per
contender: the wall and CPU time of the whole run, the start-up (the wall time of a
one-step run: imports, data, model, one step, one evaluation, one checkpoint), and the
validation loss over the whole validation split, measured after the run with one
evaluator for both. The ratio is plain wall time / gptspec wall time (goal ≥ 1.1).
"""

from __future__ import annotations

import itertools
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.plain_gpt import SHAPE, PlainGPT
from benchmarks.report import Report
from benchmarks.tokenizer import load_corpus
from gptspec.fast.data import TokenData

GROUP = "training recipe"
ROOT = Path(__file__).resolve().parent.parent
BLOCK = SHAPE["n_ctx"]
_ROUNDS = itertools.count()  # which contender goes first alternates from round to round


def _timed(argv: list[str], threads: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one child process."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               PYTHONPATH=str(ROOT))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    child = subprocess.run(argv, capture_output=True, env=env, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if child.returncode:
        last = (child.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise RuntimeError(f"{' '.join(argv[1:4])} … exited {child.returncode}: {last}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _gptspec_argv(ids: Path, out: Path, steps: int) -> list[str]:
    return [sys.executable, "-m", "gptspec", "train", "--preset", "shakespeare-char",
            "--data", str(ids), "--out", str(out), "--steps", str(steps), "--no-progress"]


def _plain_argv(ids: Path, out: Path, steps: int, threads: int) -> list[str]:
    return [sys.executable, str(ROOT / "benchmarks" / "plain_gpt.py"), "--data", str(ids),
            "--out", str(out), "--steps", str(steps), "--threads", str(threads)]


def _whole_split_loss(forward, ids: np.ndarray) -> float:
    """Mean cross-entropy over every token of the validation split (gptspec's, which the
    plain loop copies), in windows of the context length; one evaluator for both."""
    val = torch.from_numpy(TokenData.split(ids, BLOCK).val.astype(np.int64))
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(val) - 1, BLOCK):
            y = val[i + 1:i + 1 + BLOCK]
            logits = forward(val[i:i + len(y)][None])
            total += F.cross_entropy(logits[0], y, reduction="sum").item()
            count += len(y)
    return total / count


def _val_loss(name: str, out: Path, ids: np.ndarray) -> float:
    if name == "gptspec":
        from gptspec.fast.checkpoint import newest_model
        from gptspec.fast.model import GPT

        _, config, params = newest_model(out / "checkpoint")
        return _whole_split_loss(GPT.from_parameters(params, config), ids)
    model = PlainGPT(256, **SHAPE)
    model.load_state_dict(torch.load(out / "checkpoint.pt")["model"])
    return _whole_split_loss(model.eval(), ids)


def _contender(name: str, ids_path: Path, ids: np.ndarray, steps: int, threads: int,
               work: Path) -> dict[str, float]:
    out = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=work))
    start_out = Path(tempfile.mkdtemp(prefix=f"{name}-start-", dir=work))
    def argv(folder: Path, n: int) -> list[str]:
        return (_gptspec_argv(ids_path, folder, n) if name == "gptspec"
                else _plain_argv(ids_path, folder, n, threads))

    wall, cpu = _timed(argv(out, steps), threads)
    start, _ = _timed(argv(start_out, 1), threads)
    val = _val_loss(name, out, ids)
    return {"wall": wall, "cpu": cpu, "start": start, "val": val}


def run(report: Report, quick: bool, corpus: str | None = None) -> None:
    text, source = load_corpus(corpus, 1_200_000)
    steps = 100 if quick else 600
    with tempfile.TemporaryDirectory(prefix="gptspec-recipe-") as tmp:
        work = Path(tmp)
        ids = np.frombuffer(text.encode(), dtype=np.uint8).astype(np.uint16)
        ids_path = work / "ids.npy"
        np.save(ids_path, ids)
        first_plain = next(_ROUNDS) % 2 == 0
        for threads in (1, 2):
            order = ["plain", "gptspec"] if first_plain == (threads == 1) else ["gptspec", "plain"]
            results = {name: _contender(name, ids_path, ids, steps, threads, work)
                       for name in order}
            note = f"{steps} steps, {len(ids):,} byte tokens of {source}"
            for name, r in results.items():
                report.metric(GROUP, f"{name} / wall / {threads} thread(s)", r["wall"], "s", note)
                report.metric(GROUP, f"{name} / CPU / {threads} thread(s)", r["cpu"], "s", note)
                report.metric(GROUP, f"{name} / start-up (1-step run) / {threads} thread(s)",
                              r["start"], "s", "imports, data, model, a step, an evaluation, "
                              "a checkpoint")
                report.metric(GROUP, f"{name} / validation loss / {threads} thread(s)",
                              r["val"], "nats", "the whole validation split")
            report.ratio(GROUP, f"plain PyTorch wall / gptspec wall ({threads} thread(s))",
                         results["plain"]["wall"] / results["gptspec"]["wall"], goal=1.1,
                         goal_text="≥ 1.1")
            report.ratio(GROUP, f"plain PyTorch start-up / gptspec start-up ({threads} "
                         "thread(s))", results["plain"]["start"] / results["gptspec"]["start"])
