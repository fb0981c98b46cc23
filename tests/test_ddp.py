"""Data-parallel training on two CPU processes (gloo, started by torchrun): a DDP step
equals the single-process step on the concatenated batch, a resumed run continues
bit-identically, and a non-finite loss on one process stops every process in one line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gptspec.conformance import budgets as B
from gptspec.conformance.gradient_budgets import gpt_backward_bound
from gptspec.spec import GPTConfig

CONFIG = GPTConfig(vocab_size=256, n_ctx=8, d_model=16, n_layers=2, n_heads=2, d_ff=32)
BATCH = 4


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    tokens = np.random.default_rng(0).integers(0, 256, (BATCH, CONFIG.n_ctx + 1))
    return torch.from_numpy(tokens[:, :-1]), torch.from_numpy(tokens[:, 1:])


def trainer():
    from gptspec.fast.data import TokenData
    from gptspec.fast.tokenizer import Tokenizer
    from gptspec.fast.train import Trainer, TrainSettings

    data = TokenData.split(np.arange(100, dtype=np.uint16), CONFIG.n_ctx)
    return Trainer(CONFIG, TrainSettings(batch_size=BATCH, seed=3), data, Tokenizer.byte_level())


def gradients_and_step(t, x, y) -> tuple[dict, dict]:
    loss = t.loss(x, y)
    loss.backward()
    grads = {n: p.grad.detach().double().numpy().copy() for n, p in t.model.named_parameters()}
    t.optimizer.zero_grad(set_to_none=True)
    t.step_on([(x, y)])
    return grads, {n: p.detach().double().numpy().copy() for n, p in t.model.named_parameters()}


def worker(out: str) -> None:
    """Run by torchrun on each of the two processes: its half of the batch."""
    from safetensors.numpy import save_file

    from gptspec.fast.train import init_distributed

    rank, world, _ = init_distributed("cpu")
    assert world == 2
    t = trainer()
    x, y = batch()
    half = BATCH // world
    local = t.loss(x[rank * half:(rank + 1) * half], y[rank * half:(rank + 1) * half],
                   model=t.model)  # the plain module: no all-reduce
    local.backward()
    own = {f"own.{n}": p.grad.double().numpy().copy() for n, p in t.model.named_parameters()}
    t.optimizer.zero_grad(set_to_none=True)
    grads, params = gradients_and_step(t, x[rank * half:(rank + 1) * half],
                                       y[rank * half:(rank + 1) * half])
    save_file({**{f"grad.{k}": v for k, v in grads.items()},
               **{f"param.{k}": v for k, v in params.items()}, **own}, f"{out}.rank{rank}")


def cli_worker(rc_file: str, *argv: str) -> int:
    """Run by torchrun on each process: ``gptspec`` with these arguments (several commands
    separated by ``+``, one after the other, to pay torchrun's start once); the exit status
    goes to ``rc_file.rank<r>`` once they have returned (a process that hangs, or that
    torchrun ends, leaves none)."""
    from gptspec.cli import main

    commands: list[list[str]] = [[]]
    for arg in argv:
        commands.append([]) if arg == "+" else commands[-1].append(arg)
    rc = 0
    for command in commands:
        rc = main(command)
        if rc:
            break
    Path(f"{rc_file}.rank{os.environ['RANK']}").write_text(str(rc))
    return rc


def nan_on_rank_1_worker(rc_file: str, *argv: str, validation: bool = False) -> int:
    """``cli_worker`` with the training loss (or, with ``validation``, the validation loss)
    of process 1 made NaN from step 3 (its evaluation at step 2) on, the way the
    single-process CLI test makes it NaN; process 0's losses stay finite."""
    from gptspec.fast import train

    if os.environ["RANK"] == "1":
        real_loss = train.Trainer.loss

        def loss(self, x, y, model=None):
            value = real_loss(self, x, y, model)
            hit = self.step_count >= 2 and self.model.training != validation
            return value * float("nan") if hit else value

        train.Trainer.loss = loss
    return cli_worker(rc_file, *argv)


def nan_val_on_rank_1_worker(rc_file: str, *argv: str) -> int:
    return nan_on_rank_1_worker(rc_file, *argv, validation=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
                           str(Path(__file__)), *args],
                          check=check, env=env, timeout=240, capture_output=True, text=True)


TINY = ["train", "--preset", "tiny", "--vocab-size", "256", "--batch-size", "2",
        "--eval-interval", "2", "--eval-batches", "1", "--warmup", "1", "--no-progress"]


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog\n"
                            for i in range(200)))
    return path


def _run_state(out: Path) -> tuple[dict, dict, dict]:
    from safetensors.numpy import load_file

    ckpt = out / "checkpoint"
    state = json.loads((ckpt / "state.json").read_text())
    return (load_file(ckpt / "model.safetensors"), load_file(ckpt / "optimizer.safetensors"),
            state)


def test_ddp_resume_continues_bit_identically(tmp_path, corpus):
    whole, part = tmp_path / "whole", tmp_path / "part"
    rc = str(tmp_path / "rc")
    _torchrun("cli", rc, *TINY, "--data", str(corpus), "--out", str(whole), "--steps", "4",
              "+", *TINY, "--data", str(corpus), "--out", str(part), "--steps", "2")
    _torchrun("cli", rc, *TINY, "--out", str(part), "--resume", "--steps", "4")  # new processes
    (params, moments, state), (params_r, moments_r, state_r) = map(_run_state, (whole, part))
    assert state["step"] == state_r["step"] == 4
    assert state_r["history"] == state["history"]
    for mine, theirs in ((params, params_r), (moments, moments_r)):
        assert mine.keys() == theirs.keys()
        for name, value in mine.items():
            assert np.array_equal(value, theirs[name]), name


@pytest.mark.parametrize(("mode", "message", "kept"), [
    ("nan-on-rank-1", "the loss became nan at step 3 on process 1 of 2", 2),
    ("nan-val-on-rank-1", "the validation loss became nan at step 2 on process 1 of 2", 0),
])
def test_a_nan_loss_on_one_process_stops_every_process(tmp_path, corpus, mode, message, kept):
    out, rc = tmp_path / "out", tmp_path / "rc"
    done = _torchrun(mode, str(rc), *TINY, "--data", str(corpus), "--out", str(out),
                     "--steps", "4", check=False)
    assert done.returncode != 0
    # both processes returned from the command (neither hung in a collective, nor was ended
    # by torchrun), each with the CLI's error status
    assert [Path(f"{rc}.rank{r}").read_text() if Path(f"{rc}.rank{r}").exists() else None
            for r in range(2)] == ["2", "2"], done.stderr
    errors = [line for line in done.stderr.splitlines() if "gptspec train: error:" in line]
    assert len(errors) == 1, done.stderr
    assert message in errors[0]
    if kept:
        assert "last good checkpoint" in errors[0]
        assert _run_state(out)[2]["step"] == kept  # the checkpoint of step 2 is kept
    else:  # stopped by the evaluation before the first save
        assert "no checkpoint had been saved yet" in errors[0], errors[0]


def test_ddp_step_equals_the_single_process_step_on_the_whole_batch(tmp_path):
    from safetensors.numpy import load_file

    out = tmp_path / "ddp"
    _torchrun("step", str(out))
    ranks = [load_file(f"{out}.rank{r}") for r in range(2)]
    # DDP keeps the replicas identical: the same averaged gradient, the same step
    for key in (k for k in ranks[0] if not k.startswith("own.")):
        assert np.array_equal(ranks[0][key], ranks[1][key]), key
    x, y = batch()
    t = trainer()
    before = {n: p.detach().double().numpy().copy() for n, p in t.model.named_parameters()}
    grads, params = gradients_and_step(t, x, y)
    # the mean of two half-batch means is the whole batch's mean, summed in another order:
    # two float32 gradients, each within its budget of the exact one (√2: independent)
    bounds = gpt_backward_bound(x.numpy(), y.numpy(), before, CONFIG, B.Precision.of("float32"))
    scale = {name: np.sqrt(2) * error for name, (_, error) in bounds.items()}
    for name, g in grads.items():
        c = B.compare(ranks[0][f"grad.{name}"], g, B.budget(scale[name]))
        assert c.passed, (name, c.describe())
    # the check can fail: a rank's own half-batch gradient (not averaged) is outside it
    own = ranks[0]["own.blocks.0.attn.w_qkv"]
    g = grads["blocks.0.attn.w_qkv"]
    assert not B.compare(own, g, B.budget(scale["blocks.0.attn.w_qkv"])).passed
    # the first AdamW step moves each entry by at most lr_0 = lr / warmup, so replicas that
    # agree on the gradient agree on the parameters within 2 lr_0
    lr0 = 1e-3 / 100
    for name, v in params.items():
        np.testing.assert_allclose(ranks[0][f"param.{name}"], v, rtol=0, atol=2 * lr0)


if __name__ == "__main__":
    mode, *rest = sys.argv[1:]
    if mode == "step":
        worker(*rest)
    else:
        sys.exit({"cli": cli_worker, "nan-on-rank-1": nan_on_rank_1_worker,
                  "nan-val-on-rank-1": nan_val_on_rank_1_worker}[mode](*rest))
