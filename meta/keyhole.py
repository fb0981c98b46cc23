"""The mutation catalog through the keyhole: each forward-area mutant behind a wrapper that
exposes nothing but ``forward``, run through every probe, then (where none failed) the
forward area's other checks up to the first failure. Per mutant: is it still killed, and
do the probes (gptspec.conformance.checks_probes.localise) point at the entry it breaks?

    python -m meta.keyhole [--profile quick] [--jobs 2] [--json FILE] [names ...]

Localised: localise() names the mutant's entry first, or in a tie of two (a suspect
"a / b", entries the probes cannot tell apart, counts once). A mutant whose logits equal
the built-in backend's bit for bit breaks an operation the forward never calls: n/a,
unless on_the_forward_path can plant it where another engine's forward would carry it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from gptspec.adapters.kit import LogitsOnly
from gptspec.conformance.report import localisation, provenance, write_atomically
from meta.mutants import BY_NAME, MUTANTS

# the operations inside attention the fused kernel replaces
ATTENTION_PARTS = {"causal_mask", "attention_scores", "softmax", "attention_weights"}
# operations the built-in forward does not call, which another engine's forward would
ON_ANOTHER_PATH = ATTENTION_PARTS | {"multi_head_attention_head_sum"}


@dataclass
class KeyholeResult:
    name: str
    breaks: list[str]
    killed_by: list[str]  # the failing probes, else the first other check that failed
    named: list[str]  # what localise() points at
    killed: bool
    localised: bool
    applicable: bool  # False: the mutant's forward is the built-in one's, bit for bit
    seconds: float = 0.0
    smallest_failing_probe: str = ""
    why: str = ""  # where not localised: WHY_NOT_LOCALISED's account, if it has one


# Why the probes cannot tell a mutant's entry from the one they name: the account shown
# in the table while the mutant is not localised. Documentation only; localise() never
# sees it.
WHY_NOT_LOCALISED: dict[str, str] = {
    "sdpa_unscaled": "A fused attention kernel that drops 1/√d_k computes the same function "
                     "as attention_scores without it; through logits the two are one, and the "
                     "probes name the equation whose value is wrong (attention_scores): the "
                     "probes that fail are exactly those that fail for scores_unscaled.",
    "sdpa_drops_partial_key_tile": "A kernel that never loads the last partial tile of keys "
                                   "computes the same function as a causal mask that hides "
                                   "those keys; only the two probes with long contexts fail "
                                   "(causal_mask's and scaled_dot_product_attention's), and "
                                   "the smaller of them isolates the mask.",
    "sdpa_scale_capped_at_64": "A kernel that keeps 1/√64 for wider heads computes the same "
                               "function as attention_scores with that scale: only the probe "
                               "with real head widths (attention_scores') fails, and the "
                               "probes name the equation whose value is wrong.",
    "head_sum_w_o_by_columns": "W_O is applied in every attention probe, as are the QKV "
                               "projection and the head split: a wrong W_O⁽ⁱ⁾ fails exactly "
                               "the probes any attention bug fails, and the tie goes to the "
                               "entry the smallest of them isolates (qkv_projection).",
    "pre_ln_residual_from_input": "Taking the FFN's residual from the block input drops the "
                                  "attention's output from the residual stream: every pre-LN "
                                  "probe with attention active fails, and only the post-LN and "
                                  "Guide blocks pass with attention active, while block_pre_ln "
                                  "is also held by every pre-LN probe with attention silenced "
                                  "(where H' = H and the bug cannot show), so the attention "
                                  "entries score higher.",
    "online_softmax_max_not_rescaled": "Only rows of more than 64 keys whose maximum rises in "
                                       "a later block change; no probe failed at this profile "
                                       "and seed, so nothing is localised (the whole-model "
                                       "check at 1024 positions kills it).",
}


def changes_forward(mutant: Any) -> bool:
    """Whether the mutant's logits differ from the built-in backend's on some model: every
    block × FFN variant, tied and untied, with biases and a final LayerNorm; then real
    sizes (1100 positions and heads of width 72; a vocabulary past 2¹⁶)."""
    import numpy as np

    from gptspec.fast.backend import TorchBackend
    from gptspec.spec.config import GPTConfig
    from gptspec.spec.parameters import parameter_schema

    buggy = mutant.backend()
    plain = TorchBackend(dtype=buggy.dtype)  # the mutant's own dtype (float16 for some)
    rng = np.random.default_rng(0)
    small = [dict(vocab_size=11, n_ctx=6, d_model=8, n_heads=2, d_ff=8, norm=norm, ffn=ffn,
                  tied_embeddings=tied, output_bias=not tied)
             for norm in ("pre", "post", "guide")
             for ffn in ("relu", "gelu", "gelu_tanh", "guide_product") for tied in (True, False)]
    real = [dict(vocab_size=50, n_ctx=1100, d_model=144, n_heads=2, d_ff=32),
            dict(vocab_size=70001, n_ctx=8, d_model=16, n_heads=2, d_ff=32)]
    for fields in small + real:
        config = GPTConfig(n_layers=1, attn_bias=True, ffn_bias=True, final_norm=True,
                           positional_embedding=True, **fields)
        params = {s.name: rng.normal(0, 0.5, s.shape) for s in parameter_schema(config)}
        tokens = rng.integers(0, config.vocab_size, (2, config.n_ctx))
        tokens[:, -1] = config.vocab_size - 1  # the largest id: past 2¹⁶ in the big vocabulary
        try:
            got = np.asarray(buggy.forward(tokens, params, config))
        except Exception:  # noqa: BLE001 — a forward that raises has changed
            return True
        if not np.array_equal(got, np.asarray(plain.forward(tokens, params, config))):
            return True
    return False


def _explicit_attention(Q: Any, K: Any, V: Any, M: Any = None, *, is_causal: bool = False) -> Any:
    """Attention composed of the backend's own operations (mask, scores, softmax), as an
    engine that writes it out computes it, instead of PyTorch's fused kernel."""
    from gptspec.fast import ops

    if M is None or M.dtype == __import__("torch").bool:
        T, S = Q.shape[-2], K.shape[-2]
        causal = ops.causal_mask(S, dtype=Q.dtype, device=Q.device)[S - T:]
        M = causal if M is None else causal.masked_fill(~M, float("-inf"))
    return ops.attention_weights(Q, K, M.to(Q.dtype)) @ V


def on_the_forward_path(mutant: Any) -> Any:
    """A mutant of an operation the built-in forward does not call, planted where an
    engine that computes it would carry it: inside attention (the built-in one is a fused
    kernel), the same buggy operation reached through explicit attention; the Notes'
    head-sum form of multi-head attention, the buggy form computing the model's
    attention."""
    import dataclasses

    if "multi_head_attention_head_sum" in mutant.patches:
        patches = {**mutant.patches,
                   "multi_head_attention": mutant.patches["multi_head_attention_head_sum"]}
    else:
        patches = {**mutant.patches, "scaled_dot_product_attention": _explicit_attention}
    return dataclasses.replace(mutant, patches=patches)


def run_one(name: str, profile: str = "quick", seed: int = 0) -> dict:
    from gptspec.conformance.runner import run_suite

    start = time.perf_counter()
    mutant = BY_NAME[name]
    why = WHY_NOT_LOCALISED.get(name, "")
    if not changes_forward(mutant) and set(mutant.patches) & ON_ANOTHER_PATH:
        mutant = on_the_forward_path(mutant)
        name += (" (head-sum attention)" if "multi_head_attention_head_sum" in mutant.patches
                 else " (explicit attention)")
    if not changes_forward(mutant):
        return asdict(KeyholeResult(name, list(mutant.breaks), [], [], False, False, False))
    # no shrinking: the verdicts and where they point are the same, a minimal failing
    # example is not needed here, and shrinking each failing probe took most of the time
    from hypothesis import Phase, settings
    settings.register_profile("keyhole", phases=[p for p in settings().phases
                                                 if p not in (Phase.shrink, Phase.explain)])
    settings.load_profile("keyhole")
    # every probe runs (localisation needs each one's outcome); the suite's other
    # forward-area checks only where no probe failed, up to the first that fails
    backend = LogitsOnly(mutant.backend())
    suite = run_suite(backend, profile=profile, seed=seed, area="forward",
                      select=lambda c: c.id.startswith("probe."))
    failing = [r.id for r in suite.results if r.status in ("fail", "error")]
    if not failing:
        rest = run_suite(backend, profile=profile, seed=seed, area="forward",
                         select=lambda c: not c.id.startswith("probe."), stop_on_failure=True)
        failing = [r.id for r in rest.results if r.status in ("fail", "error")]
    found = localisation(suite)
    named = found["suspects"] if found else []
    # a suspect "a / b" is entries the probes cannot tell apart (equal forms)
    groups = [set(suspect.split(" / ")) for suspect in named]
    localised = bool(groups) and (bool(groups[0] & set(mutant.breaks)) or (
        len(groups) <= 2 and any(group & set(mutant.breaks) for group in groups)))
    return asdict(KeyholeResult(name, list(mutant.breaks), failing, named, bool(failing),
                                localised, True, round(time.perf_counter() - start, 1),
                                found["smallest_failing_probe"] if found else "",
                                "" if localised else why))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m meta.keyhole", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="mutants (default: every forward-area one)")
    parser.add_argument("--profile", default="quick", choices=("quick", "default", "thorough"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", metavar="FILE", help="write the results here")
    args = parser.parse_args(argv)
    names = args.names or [m.name for m in MUTANTS if m.area == "forward"]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        parser.error(f"unknown mutant {unknown[0]!r}")
    context = multiprocessing.get_context("spawn")
    done: dict[str, dict] = {}
    started = provenance()  # the commit tested, taken before the run

    def save(complete: bool) -> None:
        """The results so far (``complete`` false while mutants are still running)."""
        if args.json:
            write_atomically(args.json, json.dumps(
                {"schema": "gptspec-keyhole", "version": 1, "profile": args.profile,
                 "seed": args.seed, "provenance": started, "complete": complete,
                 "results": [done[n] for n in names if n in done]}, indent=1) + "\n")

    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=context) as pool:
        futures = {pool.submit(run_one, n, args.profile, args.seed): n for n in names}
        for future in concurrent.futures.as_completed(futures):
            r = future.result()
            done[futures[future]] = r
            print(f"{r['name']}: {'killed' if r['killed'] else 'n/a' if not r['applicable'] else 'SURVIVED'}"
                  f", points at {', '.join(r['named']) or '-'} ({r['seconds']:.0f} s)",
                  file=sys.stderr, flush=True)
            save(complete=False)
    results = [done[n] for n in names]
    rows = [("mutant", "breaks", "killed", "probes point at", "localised")]
    for r in results:
        rows.append((r["name"], ", ".join(r["breaks"]), "yes" if r["killed"] else "NO",
                     ", ".join(r["named"]) or "-",
                     "n/a" if not r["applicable"] else ("yes" if r["localised"] else "no")))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for i, row in enumerate(rows):
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
        if i == 0:
            print("| " + " | ".join("-" * w for w in widths) + " |")
    applicable = [r for r in results if r["applicable"]]
    killed = sum(r["killed"] for r in applicable)
    localised = sum(r["localised"] for r in applicable)
    print(f"\n{killed} of {len(applicable)} forward mutants that forward computes are killed "
          f"through the keyhole; {localised} of {len(applicable)} localised to their entry "
          f"(profile {args.profile}, seed {args.seed}); "
          f"{len(results) - len(applicable)} leave the model's forward unchanged (n/a)")
    for r in results:
        if r["applicable"] and not r["localised"]:
            print(f"  {r['name']}: {r['why'] or 'not localised, no account given'}")
    save(complete=True)
    return 0 if killed == len(applicable) else 1


if __name__ == "__main__":
    sys.exit(main())
