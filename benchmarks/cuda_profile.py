"""Where a GPT-2-small bf16 training step goes on a CUDA device: tokens/s and MFU of the
step written three ways, then the profiler's heaviest kernels of the fastest.

* ``eager``: no torch.compile (what ``gptspec train`` runs);
* ``compiled model``: ``compile_model`` (the model's whole-sequence path), loss eager
  (benchmarks/gpu.py's step);
* ``compiled step``: the forward and the float32 cross-entropy in one compiled function,
  so the (B·T × V) float32 logits never reach memory whole.

    python -m benchmarks.cuda_profile [--batch 16] [--steps 20]

Diagnostic only (``nox -s bench`` runs benchmarks/gpu.py); prints a table, then the
kernels.
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.machine import dense_bf16_peak  # noqa: E402
from gptspec.fast.model import GPT, compile_model  # noqa: E402
from gptspec.fast.optimizer import AdamW  # noqa: E402
from gptspec.fast.train import mean_cross_entropy  # noqa: E402
from gptspec.reference import costs  # noqa: E402
from gptspec.spec import PRESETS  # noqa: E402


def make_step(variant: str, batch: int):
    config = PRESETS["gpt2"]
    model = GPT(config, device="cuda", seed=0).train()
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    opt = AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                lr=1e-4, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator(device="cuda").manual_seed(0)
    data = torch.randint(0, config.vocab_size, (batch, config.n_ctx + 1), device="cuda",
                         generator=gen)
    x, y = data[:, :-1], data[:, 1:]

    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return mean_cross_entropy(model._forward(x), y)

    if variant == "compiled model":
        compile_model(model)
    compiled_loss = torch.compile(loss_of) if variant == "compiled step" else None

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            if compiled_loss is not None:
                loss = compiled_loss(x, y)
            else:
                loss = mean_cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return config, step


def tokens_per_second(step, tokens: int, steps: int) -> float:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return tokens * steps / (time.perf_counter() - t0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--variants", default="eager,compiled model,compiled step")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    peak = dense_bf16_peak(torch.cuda.get_device_name()) or float("nan")
    best = None
    for variant in args.variants.split(","):
        t0 = time.perf_counter()
        config, step = make_step(variant, args.batch)
        tokens = args.batch * config.n_ctx
        tps = tokens_per_second(step, tokens, args.steps)
        mfu = tps * costs.training_flops_per_token(config) / peak
        print(f"{variant:>16}: {tps:10.0f} tokens/s  MFU {100 * mfu:5.1f}%  "
              f"({time.perf_counter() - t0:.0f} s with warm-up)", flush=True)
        if best is None or tps > best[1]:
            best = (variant, tps, step)
        torch.cuda.empty_cache()
    assert best is not None
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            best[2]()
        torch.cuda.synchronize()
    print(f"\nheaviest kernels of '{best[0]}' (3 steps):")
    averages = prof.key_averages()
    try:
        print(averages.table(sort_by="device_time_total", row_limit=22, max_name_column_width=70))
    except (AttributeError, KeyError):  # torch releases before the name "device"
        print(averages.table(sort_by="cuda_time_total", row_limit=22, max_name_column_width=70))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
