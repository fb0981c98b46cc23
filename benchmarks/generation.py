"""Generation throughput: gptspec.fast.generate against transformers' generate() and
against the memory-bandwidth limit.

A GPT-2-small-shaped model with random weights (GPT-2's initialisation), the same weights
loaded into transformers' GPT2LMHeadModel (gptspec.fast.hf_interop: our schema maps onto
its names one to one, Conv1D weights are (in, out) like ours). Both decode greedily with
their KV cache, 256 new tokens after an 8-token prompt, at batch 1 and 8, no end-of-text
stop; tokens/s is (batch × new tokens) / median wall time, the two timed in turn within
each repeat; their ratio is the median of the per-repeat ratios.

Both are measured in float32 and in bfloat16 (the weights rounded once, both models
holding the same bf16 weights). In bfloat16 on the CPU, gptspec multiplies by weights
packed once (gptspec.fast.prepacked): at batch 1 for its own GEMV kernel
(gptspec.fast.bf16_gemv) where the CPU has AVX-512 BF16, otherwise for oneDNN;
transformers uses PyTorch's matmul, which reorders the weights on every call. Each
result's note says which product ran.

The bandwidth limit: at batch 1 every step reads every weight once (the unembedding
reads all of W_E; the embeddings only one row each), so no implementation can exceed
(copy bandwidth) / (bytes of weights) steps per second; bfloat16 halves the bytes. Copy
bandwidth is measured here as (bytes read + bytes written) / time of a large tensor copy.

    python -m benchmarks.generation [--quick] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from benchmarks.forward import interleaved_seconds
from benchmarks.machine import copy_bandwidth
from benchmarks.report import Report
from gptspec.fast import prepacked
from gptspec.fast.bf16_gemv import BlockedWeight
from gptspec.fast.generate import GREEDY, generate
from gptspec.fast.hf_interop import to_hf_model
from gptspec.fast.model import GPT
from gptspec.spec.config import GPTConfig, preset

GROUP = "generation"
PROMPT_LENGTH = 8


def hf_model(config: GPTConfig, model: GPT):
    """transformers' GPT2LMHeadModel holding ``model``'s weights (gptspec.fast.hf_interop)."""
    hf = to_hf_model(dict(model.named_parameters()), config, dtype=model.wte.dtype)
    return hf.to(model.wte.device)


def hf_generate(hf, prompts: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """Greedy decoding with transformers' generate(), exactly max_new_tokens tokens."""
    with torch.inference_mode():
        out = hf.generate(prompts, attention_mask=torch.ones_like(prompts),
                          max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                          do_sample=False, use_cache=True, pad_token_id=0)
    return out[:, prompts.shape[1]:]


def weight_bytes_per_step(model: GPT) -> int:
    """Bytes of weights one decoding step reads: all of them, but one row of W_P."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    wpe = model.wpe
    return total - wpe.numel() * wpe.element_size() + wpe.shape[1] * wpe.element_size()


DTYPES = ("float32", "bfloat16")
# a wrong weight mapping moves logits by their own size; rounding by ~u of the dtype
# times the depth's growth
MAPPING_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.1}


def run(report: Report, quick: bool) -> None:
    config = preset("gpt2")
    new_tokens = 32 if quick else 256
    repeats = 1 if quick else 3
    threads = torch.get_num_threads()
    # measured here, beside the runs it bounds (benchmarks.machine's method)
    bandwidth = report.metric(GROUP, "copy bandwidth (read + write)",
                              copy_bandwidth("cpu", 256 << 20, 5 if quick else 9) / 1e9,
                              "GB/s", note=f"{threads} threads")
    rates: dict[tuple[str, str], float] = {}
    for dtype in DTYPES:
        rates.update(_compare_in(report, config, dtype, bandwidth, new_tokens, repeats,
                                 threads))
    report.ratio(GROUP, "gptspec bfloat16 / transformers float32 tokens/s, batch 1 "
                 "(medians of separate runs)",
                 rates[("gptspec", "bfloat16")] / rates[("transformers", "float32")])


def _compare_in(report: Report, config: GPTConfig, dtype: str, bandwidth: float,
                new_tokens: int, repeats: int, threads: int) -> dict[tuple[str, str], float]:
    """gptspec and transformers in one dtype, same weights (GPT-2's initialisation, rounded
    to the dtype once, then copied): batch 1 and 8, and batch 1 against the bandwidth
    limit of that dtype's weight bytes. Returns the batch-1 tokens/s of each."""
    model = GPT(config, seed=0, dtype=dtype).eval().requires_grad_(False)
    hf = hf_model(config, model)

    # The two must compute the same function before their speeds mean anything.
    check = torch.randint(0, config.vocab_size, (2, PROMPT_LENGTH),
                          generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        ours_logits, theirs_logits = model(check).float(), hf(check).logits.float()
    if not (ours_logits - theirs_logits).abs().max() \
            <= MAPPING_TOLERANCE[dtype] * ours_logits.abs().max():
        raise RuntimeError("transformers' model does not compute our logits: bad weight mapping")

    n_bytes = weight_bytes_per_step(model)
    report.metric(GROUP, f"weight bytes read per step, {dtype}", n_bytes / 1e6, "MB")
    limit = bandwidth * 1e9 / n_bytes
    report.metric(GROUP, f"bandwidth limit, batch 1, {dtype}", limit, "tokens/s",
                  note="copy bandwidth / weight bytes per step")

    batch_1: dict[tuple[str, str], float] = {}
    for batch in (1, 8):
        prompts = torch.randint(0, config.vocab_size, (batch, PROMPT_LENGTH),
                                generator=torch.Generator().manual_seed(batch))
        prompt_lists = prompts.tolist()
        # timed in turn within each repeat, so that both see the same machine load
        medians, ratios = interleaved_seconds({
            "gptspec": lambda: generate(model, prompt_lists, new_tokens, GREEDY),  # noqa: B023
            "transformers": lambda: hf_generate(hf, prompts, new_tokens),  # noqa: B023
        }, repeats, "cpu")
        note = f"GPT-2 small shape, random weights, {new_tokens} new tokens, greedy, " \
               f"{threads} threads"
        packed = prepacked.for_model(model, rows=batch)
        ours_note = f"{note}; products: " + (
            "PyTorch's matmul" if packed is None
            else "gptspec's bf16 GEMV kernel" if packed.layout is BlockedWeight
            else "oneDNN, prepacked")
        for name in medians:
            rate = report.metric(GROUP, f"{name} generate, batch {batch}, {dtype}",
                                 batch * new_tokens / medians[name], "tokens/s",
                                 note=ours_note if name == "gptspec" else note)
            if batch == 1:
                batch_1[(name, dtype)] = rate
        report.ratio(GROUP, f"gptspec / transformers tokens/s, batch {batch}, {dtype}",
                     ratios[("gptspec", "transformers")], goal=2.0 if batch == 1 else None,
                     goal_text="≥ 2 (CPU)" if batch == 1 else "")
    report.ratio(GROUP, f"gptspec tokens/s / bandwidth limit, batch 1, {dtype}",
                 batch_1[("gptspec", dtype)] / limit, goal=1 / 1.5,
                 goal_text="≥ 1/1.5 (within 1.5× of the limit)")
    return batch_1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    report = Report()
    t0 = time.perf_counter()
    run(report, args.quick)
    print(json.dumps(report.to_dict(), indent=2))
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
