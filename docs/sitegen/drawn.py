"""What the conformance checks draw, per profile: the shapes and magnitudes, read from the
suite's own constants (``gptspec.conformance.strategies`` and ``context.PROFILES``), so
that the page cannot drift from what runs."""

from __future__ import annotations

from sitegen.markup import code, esc, table


def _values(values: tuple[int, ...]) -> str:
    return ", ".join(str(v) for v in values)


def _magnitude(x: float) -> str:
    return f"{x:.4g}"


def section() -> str:
    """The conformance page's section on sizes and magnitudes, in Markdown."""
    from gptspec.conformance import budgets, strategies
    from gptspec.conformance.cases import GPT2_SMALL, MODEL_SHARE, ROW_WISE_SHARE
    from gptspec.conformance.checks_gradients import LONG_BATCH, LONG_BATCH_SIZE
    from gptspec.conformance.checks_sampling import GENERATION_SHARE
    from gptspec.conformance.context import PROFILES

    s = strategies
    share = s.BIG_SHARE
    parts = ["## What the checks draw\n",
             "Each property runs a profile's number of Hypothesis examples. Besides small "
             f"shapes, an example draws, with probability {share:.2g} ({ROW_WISE_SHARE:.2g} "
             f"for the row-wise maps, {MODEL_SHARE:.2g} for model configurations), sizes "
             "at the boundaries where real kernels change path; a failing example still "
             "shrinks to a small shape where one fails too.\n"]
    rows = [[code(name), str(n), f"≈ {n * share:.0f}",
             f"≈ {n * share / len(s.KERNEL_BLOCKS):.1f}"] for name, n in PROFILES.items()]
    parts.append(table(["Profile", "Examples per property", "Boundary-sized examples per "
                        "property", "…per block size"], rows))
    c = GPT2_SMALL
    rows = [
        ["Sequence lengths, key counts, row lengths",
         f"1 … 8 (up to 40 for rows); {esc(_values(s.BOUNDARY_LENGTHS))}. A model "
         "drawn big for its context or head width always runs at one of these lengths "
         "(n_ctx itself if it reaches none)"],
        ["Head widths d_k", f"1 … 16; {esc(_values(s.HEAD_WIDTHS))}"],
        ["Vocabularies", f"2 … 30; {esc(_values(s.VOCAB_SIZES))}, with the top ids and "
                         "the ids around 2¹⁶ drawn as often as the rest"],
        ["Batches", "1 … 3 sequences"],
        ["Model configurations", "small (≤ 2 layers, ≤ 3 heads, n_ctx ≤ 8), or, with "
                                 f"probability {MODEL_SHARE:.2g}, big in one of "
                                 f"{esc(', '.join(s.MODEL_CONCERNS))}"],
        ["Which checks draw big configurations",
         "the model checks (gpt_forward, the blocks, the next-token distribution), the "
         f"gradients and the loss (gpt_backward, cross_entropy_mean) with probability "
         f"{MODEL_SHARE:.2g}; the generation checks with probability "
         f"{GENERATION_SHARE:.2g}, their prompts crossing a kernel block. The training "
         "loop, determinism and resume checks draw small ones: their subject is the "
         "loop's bookkeeping (schedule, decay, clipping, accumulation, state), which does "
         "not change with size, while N steps of a big model against the float64 reference "
         "would cost minutes per example"],
        ["Every run", f"a GPT-2-small-shaped model ({c.n_layers} block, d_model "
                      f"{c.d_model}, {c.n_heads} heads, d_ff {c.d_ff}, vocabulary "
                      f"{c.vocab_size}) at T = {c.n_ctx}, batch 1 "
                      f"({code('gpt_forward.gpt2_small')}); every gradient of a GPT-2-shaped "
                      f"block of width {LONG_BATCH.d_model} ({LONG_BATCH.n_heads} heads of "
                      f"{LONG_BATCH.d_model // LONG_BATCH.n_heads}, vocabulary "
                      f"{LONG_BATCH.vocab_size}) over {LONG_BATCH_SIZE} × {LONG_BATCH.n_ctx} "
                      "tokens as skewed as a text's, where sums over rows and over a "
                      f"token's repeats are long ({code('gpt_backward.long_batch')})"],
    ]
    parts.append(table(["Size", "Drawn"], rows))
    parts.append("Magnitudes, per dtype: the *large* flavour's (for inputs of stacked "
                 "products, and for one product of inner length 64); the *overflow edge* "
                 "up to which softmax, the next-token distribution and LayerNorm (rows of "
                 "1025) draw; and the smallest normal number, from 2⁻¹⁰ to 4 times which "
                 "the *underflow edge* flavour draws.\n")
    rows = [[code(dt), _magnitude(s.large_scale(dt)), _magnitude(s.large_scale(dt, 64)),
             _magnitude(s.edge_scale(dt)), _magnitude(s.edge_scale(dt, 4 * 1025, 2)),
             _magnitude(budgets.TINY[dt]), _magnitude(budgets.ABSOLUTE_FLOOR[dt])]
            for dt in budgets.UNIT_ROUNDOFF]
    parts.append(table(["dtype", "large", "large, n = 64", "overflow edge (softmax)",
                        "overflow edge (LayerNorm)", "smallest normal",
                        "a stored result's absolute floor"], rows))
    parts.append("The absolute floor is what a budget allows a stored result besides its "
                 "relative rounding u·|y|: the smallest normal number. Below it float16 "
                 "keeps subnormals, but roundings there repeat from row to row (nearly "
                 "equal values land on the same grid point), which the budgets' "
                 "independent-rows model cannot follow; so float16's floor is its smallest "
                 "normal too, and its gradients of long batches (all below it) are checked "
                 "only loosely. A sum of subnormal roundings may drift by half the floor "
                 "per term (`budgets.ABSOLUTE_FLOOR`, `Precision.floor_drift`).\n")
    return "\n".join(parts) + "\n"
