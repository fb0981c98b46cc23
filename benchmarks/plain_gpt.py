"""The peer that gptspec's training is timed against: a plain, idiomatic PyTorch GPT and
training loop, written the way a PyTorch user would write them (nn.Module layers,
``F.scaled_dot_product_attention``, ``torch.optim.AdamW``), with nothing of gptspec's.

    python benchmarks/plain_gpt.py --data ids.npy --out DIR --steps 600 --threads 1

The recipe is gptspec's ``shakespeare-char`` one (the settings below are TrainSettings'
defaults): pre-LN blocks, GELU (tanh), tied embeddings, biases everywhere; batches of 12
windows of 64 tokens at random offsets of the first 90% of the ids; AdamW β = (0.9, 0.99),
ε 1e-8, weight decay 0.1 on matrices only; learning rate warmed up linearly over 100 steps
then cosine-decayed from 1e-3 to 1e-4 at the last step; gradients clipped to norm 1; the
validation loss over 20 fixed batches every 250 steps and at the end, with a checkpoint
(model and optimizer, DIR/checkpoint.pt) written after each. Prints one JSON line: the
seconds to the end of the first optimizer step, the whole wall and CPU time.
"""

from __future__ import annotations

import time

START = time.perf_counter()  # before the imports: start-up is part of what is compared

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# the shakespeare-char model's shape (gptspec's preset of that name, written out here)
SHAPE = {"n_ctx": 64, "d_model": 128, "n_layers": 4, "n_heads": 4, "d_ff": 512}


class SelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)
                   for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, n_heads)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(approximate="tanh"),
                                 nn.Linear(d_ff, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class PlainGPT(nn.Module):
    def __init__(self, vocab_size: int, n_ctx: int, d_model: int, n_layers: int, n_heads: int,
                 d_ff: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab_size, d_model)
        self.wpe = nn.Embedding(n_ctx, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, d_ff) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2's scaled residual projections
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * n_layers))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.T  # tied unembedding


def get_batch(data: torch.Tensor, batch_size: int, block: int, gen: torch.Generator):
    starts = torch.randint(len(data) - block, (batch_size,), generator=gen)
    x = torch.stack([data[i:i + block] for i in starts.tolist()])
    y = torch.stack([data[i + 1:i + 1 + block] for i in starts.tolist()])
    return x, y


def learning_rate(step: int, max_steps: int, lr: float, min_lr: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to min_lr at the last step; a run shorter than
    the warm-up warms up over its own length (as gptspec's TrainSettings does)."""
    warmup = min(warmup, max_steps)
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, max_steps - warmup)
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * min(1.0, progress)))


@torch.no_grad()
def validation_loss(model: PlainGPT, val: torch.Tensor, batches: int, batch_size: int,
                    block: int) -> float:
    model.eval()
    gen = torch.Generator().manual_seed(7919)  # the same batches at every evaluation
    losses = []
    for _ in range(batches):
        x, y = get_batch(val, batch_size, block, gen)
        logits = model(x)
        losses.append(F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1)).item())
    model.train()
    return sum(losses) / len(losses)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="token ids (.npy)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--vocab-size", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1337)
    batch_size, block, eval_interval, eval_batches = 12, SHAPE["n_ctx"], 250, 20

    ids = torch.from_numpy(np.load(args.data).astype(np.int64))
    n_val = max(int(0.1 * len(ids)), block + 1)  # the last tenth validates, as gptspec's
    train, val = ids[:-n_val], ids[-n_val:]
    model = PlainGPT(args.vocab_size, **SHAPE)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=1e-3, betas=(0.9, 0.99), eps=1e-8)
    gen = torch.Generator().manual_seed(1337)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    first_step = None
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args.steps, 1e-3, 1e-4, 100)
        x, y = get_batch(train, batch_size, block, gen)
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if first_step is None:
            first_step = time.perf_counter() - START
        done = step + 1
        if done % eval_interval == 0 or done == args.steps:
            val_loss = validation_loss(model, val, eval_batches, batch_size, block)
            print(f"step {done}: train loss {loss.item():.4f}, val loss {val_loss:.4f}",
                  flush=True)
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "step": done}, out / "checkpoint.pt")
    print(json.dumps({"first_step_s": first_step, "wall_s": time.perf_counter() - START,
                      "cpu_s": time.process_time()}))


if __name__ == "__main__":
    main()
