"""A study's numbers per arm and per comparison, computed from its runs alone.

The runner writes this into the study's JSON for readers of the file; the site's page
computes it again from the same runs (``docs/sitegen/open_questions.py``), so what the
page says is a function of the per-seed results and cannot drift from them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gptspec.experiments.metrics import Interval, paired_difference, t_interval

MEANS = ("val_tokens_per_byte", "train_tokens_per_byte", "train_flops", "train_flops_per_byte",
         "inference_flops_per_byte", "train_bytes_seen")


class ResultsError(ValueError):
    """A study's results that cannot be summarised (a run missing from an arm, say)."""


def by_arm(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[int, Mapping[str, Any]]]:
    """arm → seed → the run's result."""
    table: dict[str, dict[int, Mapping[str, Any]]] = {}
    for r in runs:
        table.setdefault(str(r["arm"]), {})[int(r["seed"])] = r["result"]
    return table


def _paired(a: Mapping[int, Mapping[str, Any]], b: Mapping[int, Mapping[str, Any]]) -> Interval:
    seeds = sorted(set(a) & set(b))
    if not seeds:
        raise ResultsError("two arms compared share no seed")
    return paired_difference([a[s]["bits_per_byte"] for s in seeds],
                             [b[s]["bits_per_byte"] for s in seeds])


def difference(a: Mapping[int, Mapping[str, Any]], b: Mapping[int, Mapping[str, Any]]) -> dict:
    """Arm a minus arm b in bits per byte, paired by seed; inside the noise when the
    interval of the differences contains 0 (always, with one seed: no interval)."""
    d = _paired(a, b)
    ia = t_interval([r["bits_per_byte"] for r in a.values()])
    ib = t_interval([r["bits_per_byte"] for r in b.values()])
    return {"difference": d.to_dict(), "inside_noise": d.n < 2 or d.contains(0.0),
            "intervals_overlap": ia.overlaps(ib)}


def summarize(arms: Sequence[Mapping[str, Any]], comparisons: Sequence[Mapping[str, Any]],
              runs: Sequence[Mapping[str, Any]]) -> dict:
    """``arms``: the design's arms (name, …) in order; ``comparisons``: {a, b, matched};
    ``runs``: {arm, seed, result}. Per arm: the bits-per-byte interval over seeds and the
    means of the cost figures; per comparison, and of every arm against the best one: the
    paired difference."""
    table = by_arm(runs)
    missing = [a["name"] for a in arms if a["name"] not in table]
    if missing:
        raise ResultsError(f"no run of arm {missing[0]!r}")
    seeds = {name: sorted(per_seed) for name, per_seed in table.items()}
    if len({tuple(s) for s in seeds.values()}) > 1:
        raise ResultsError(f"the arms were run with different seeds: {seeds}")
    out: dict[str, Any] = {"arms": {}, "comparisons": [], "against_best": {}}
    for a in arms:
        results = table[a["name"]]
        values = [results[s]["bits_per_byte"] for s in sorted(results)]
        row: dict[str, Any] = {"bits_per_byte": t_interval(values).to_dict(), "values": values,
                               "seeds": sorted(results)}
        for key in MEANS:
            row[key] = float(np.mean([r[key] for r in results.values()]))
        row["train_seconds"] = float(np.mean([r["seconds"]["train_wall"]
                                              for r in results.values()]))
        out["arms"][a["name"]] = row
    best = min(out["arms"], key=lambda name: out["arms"][name]["bits_per_byte"]["mean"])
    out["best"] = best
    for name in out["arms"]:
        if name != best:
            out["against_best"][name] = difference(table[name], table[best])
    for c in comparisons:
        out["comparisons"].append({"a": c["a"], "b": c["b"], "matched": c["matched"],
                                   **difference(table[c["a"]], table[c["b"]])})
    return out
