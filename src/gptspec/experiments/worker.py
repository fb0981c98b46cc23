"""One run of a study, in a process of its own: ``python -m gptspec.experiments.worker SPEC``.

SPEC is the JSON the runner writes: the run's settings (what decides its result) and the
paths of its token files and of its result file. The run trains with the project's
trainer (``gptspec.fast.train.Trainer``, what ``gptspec train`` uses) on one thread,
measures the validation loss on fixed windows along the way (the learning curve), then on
the whole validation split, and writes its result file whole (temporary name, then
rename): a run that is killed leaves nothing, and the study's rerun does it again. It
dies with the study's process, even one killed by SIGKILL (``gptspec.parent_death``).
"""

from __future__ import annotations

import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from gptspec.atomic_files import write_text
from gptspec.experiments.metrics import bits_per_byte
from gptspec.parent_death import die_with_parent
from gptspec.reference.costs import forward_flops_per_token, training_flops_per_token
from gptspec.spec.config import GPTConfig

RESULT_SCHEMA = "gptspec-experiment-run"


def token_byte_lengths(tokenizer, vocab_size: int) -> np.ndarray:
    """The number of bytes each token id spells."""
    return np.array([len(tokenizer.token_bytes(i)) for i in range(vocab_size)], dtype=np.int64)


def window_starts(n_tokens: int, n_ctx: int) -> list[int]:
    """Where the windows that cover a split start: every n_ctx tokens, so that each token
    but the first is predicted exactly once (the last window may be shorter)."""
    return list(range(0, n_tokens - 1, n_ctx))


@torch.no_grad()
def split_loss(model: torch.nn.Module, ids: np.ndarray, starts: list[int], n_ctx: int,
               byte_lengths: np.ndarray, batch: int) -> tuple[float, int, int]:
    """(summed cross-entropy in nats, predicted tokens, bytes those tokens spell) of the
    windows of n_ctx + 1 tokens at ``starts`` (a window is cut short at the split's end):
    each window's first n_ctx tokens predict its next n_ctx."""
    was_training = model.training
    model.eval()
    nats, count, n_bytes = 0.0, 0, 0
    windows = [np.asarray(ids[s: s + n_ctx + 1], dtype=np.int64) for s in starts]
    full = [w for w in windows if len(w) == n_ctx + 1]
    short = [w for w in windows if 1 < len(w) < n_ctx + 1]
    groups = [full[i: i + batch] for i in range(0, len(full), batch)] + [[w] for w in short]
    for group in groups:
        stacked = torch.from_numpy(np.stack(group))
        x, y = stacked[:, :-1], stacked[:, 1:]
        logits = model(x)
        losses = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1),
                                 reduction="none")
        nats += float(losses.double().sum())
        count += y.numel()
        n_bytes += int(byte_lengths[y.numpy()].sum())
    model.train(was_training)
    return nats, count, n_bytes


def curve_starts(n_tokens: int, n_ctx: int, windows: int) -> list[int]:
    """``windows`` evenly spaced windows of n_ctx + 1 tokens across a split (fewer if it
    is short): the same validation text at every point of a learning curve."""
    last = n_tokens - n_ctx - 1
    return sorted({round(i * last / max(1, windows - 1)) for i in range(windows)})


def check_files(spec: dict) -> None:
    """The tokenizer and token files are the ones the runner checked against the cache's
    record (their SHA-256 in the spec): a file changed since is not trained on."""
    from gptspec.experiments.corpus import file_sha256

    for name, digest in spec.get("sha256", {}).items():
        path = Path(spec["paths"][name])
        try:
            actual = file_sha256(path)
        except OSError as err:
            raise RuntimeError(f"{path} cannot be read ({err.strerror or err})") from None
        if actual != digest:
            raise RuntimeError(f"{path} changed after the study checked it (its SHA-256 "
                               "differs); run the study again, which makes it again")


def run(spec: dict) -> dict:
    """Train and evaluate one run; returns its result record."""
    from gptspec.fast.data import TokenData
    from gptspec.fast.tokenizer import Tokenizer
    from gptspec.fast.train import Trainer, TrainSettings

    torch.set_num_threads(1)
    check_files(spec)
    settings, paths = spec["settings"], spec["paths"]
    config = GPTConfig.from_dict(settings["config"])
    train_settings = TrainSettings.from_dict(settings["train"])
    tokenizer = Tokenizer.load(paths["tokenizer"])
    train_ids = np.load(paths["train"], mmap_mode="r")
    val_ids = np.load(paths["val"], mmap_mode="r")
    lengths = token_byte_lengths(tokenizer, config.vocab_size)
    T, batch = config.n_ctx, settings["eval"]["eval_batch"]
    trainer = Trainer(config, train_settings, TokenData(train_ids, val_ids, T), tokenizer)

    marks = set(settings["eval"]["curve_steps"])
    probe = curve_starts(len(val_ids), T, settings["eval"]["curve_windows"])
    curve, losses = [], []
    train_wall = train_cpu = 0.0
    while trainer.step_count < train_settings.max_steps:
        wall, cpu = time.perf_counter(), time.process_time()
        losses.append(trainer.step())
        train_wall += time.perf_counter() - wall
        train_cpu += time.process_time() - cpu
        if not math.isfinite(losses[-1]):
            raise RuntimeError(f"the training loss became {losses[-1]} at step "
                               f"{trainer.step_count}")
        if trainer.step_count in marks:
            nats, _, n_bytes = split_loss(trainer.model, val_ids, probe, T, lengths, batch)
            curve.append([trainer.step_count, bits_per_byte(nats, n_bytes)])

    wall, cpu = time.perf_counter(), time.process_time()
    nats, n_tokens, n_bytes = split_loss(trainer.model, val_ids, window_starts(len(val_ids), T),
                                         T, lengths, batch)
    eval_wall, eval_cpu = time.perf_counter() - wall, time.process_time() - cpu
    # a result is finite (the runner refuses to reuse one that is not: see
    # runner.result_problem), so a loss that overflowed float32 fails the run here
    final = bits_per_byte(nats, n_bytes)
    if not (math.isfinite(final) and all(math.isfinite(b) for _, b in curve)):
        raise RuntimeError(f"the validation loss is not finite ({final} bits per byte)")
    tokens_per_step = train_settings.batch_size * T
    train_tok_per_byte = settings["tokenizer"]["train_tokens"] / settings["data"]["train_bytes"]
    val_tok_per_byte = n_tokens / n_bytes
    steps = train_settings.max_steps
    return {
        "bits_per_byte": final,
        "nats_per_token": nats / n_tokens,
        "val_tokens": n_tokens,
        "val_bytes": n_bytes,
        "val_tokens_per_byte": val_tok_per_byte,
        "train_tokens_per_byte": train_tok_per_byte,
        "train_flops": steps * tokens_per_step * training_flops_per_token(config),
        "train_bytes_seen": steps * tokens_per_step / train_tok_per_byte,
        "train_flops_per_byte": training_flops_per_token(config) * train_tok_per_byte,
        "inference_flops_per_byte": forward_flops_per_token(config) * val_tok_per_byte,
        "curve": curve,  # [step, bits per byte on the curve windows]
        "train_loss": _thin(losses, 100),  # [step, mean training loss (nats/token) up to it]
        "seconds": {"train_wall": train_wall, "train_cpu": train_cpu, "eval_wall": eval_wall,
                    "eval_cpu": eval_cpu, "threads": torch.get_num_threads()},
    }


def _thin(losses: list[float], points: int) -> list[list[float]]:
    """The training losses as about ``points`` means over consecutive steps."""
    every = max(1, len(losses) // points)
    return [[i + len(chunk), float(np.mean(chunk))]
            for i in range(0, len(losses), every) for chunk in [losses[i: i + every]]]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m gptspec.experiments.worker SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    if "parent" in spec:  # an orphan went on to finish its run beside the rerun's
        die_with_parent(spec["parent"])
    from gptspec.conformance.report import provenance

    started = provenance()
    result = run(spec)
    # from the runner's start of this process: imports included
    result["seconds"]["process_wall"] = time.time() - spec["launched"]
    record = {"schema": RESULT_SCHEMA, "settings": spec["settings"], "result": result,
              "provenance": {**started, "torch": torch.__version__,
                             "numpy": np.__version__, "host": platform.node()}}
    write_text(spec["paths"]["result"], json.dumps(record, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
