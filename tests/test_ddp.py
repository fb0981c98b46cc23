"""Data-parallel training: a DDP step on two CPU processes (gloo, started by torchrun)
equals the single-process step on the concatenated batch."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from gptspec.conformance import budgets as B
from gptspec.conformance.checks_training import gradient_scale, largest_gradient
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_step_equals_the_single_process_step_on_the_whole_batch(tmp_path):
    from safetensors.numpy import load_file

    out = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                    "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
                    str(Path(__file__)), str(out)],
                   check=True, env=env, timeout=240, capture_output=True)
    ranks = [load_file(f"{out}.rank{r}") for r in range(2)]
    # DDP keeps the replicas identical: the same averaged gradient, the same step
    for key in (k for k in ranks[0] if not k.startswith("own.")):
        assert np.array_equal(ranks[0][key], ranks[1][key]), key
    x, y = batch()
    grads, params = gradients_and_step(trainer(), x, y)
    p = B.Precision.of("float32")
    # the mean of two half-batch means is the whole batch's mean, summed in another order
    scale = gradient_scale(largest_gradient(grads), CONFIG, x.numpy(), p)
    for name, g in grads.items():
        c = B.compare(ranks[0][f"grad.{name}"], g, B.budget(scale))
        assert c.passed, (name, c.describe())
    # the check can fail: a rank's own half-batch gradient (not averaged) is outside it
    own = ranks[0]["own.blocks.0.attn.w_qkv"]
    g = grads["blocks.0.attn.w_qkv"]
    assert not B.compare(own, g, B.budget(scale)).passed
    # the first AdamW step moves each entry by at most lr_0 = lr / warmup, so replicas that
    # agree on the gradient agree on the parameters within 2 lr_0
    lr0 = 1e-3 / 100
    for name, v in params.items():
        np.testing.assert_allclose(ranks[0][f"param.{name}"], v, rtol=0, atol=2 * lr0)


if __name__ == "__main__":
    worker(sys.argv[1])
