"""A study's figures as SVG (matplotlib, the ``experiments`` extra): the learning curves,
and the final validation loss against the varied quantity with its 95% intervals.

The SVG is made reproducible (no date, a fixed salt for element ids), so the same
results give the same bytes and the study's JSON can name each figure by its SHA-256.
"""

from __future__ import annotations

import io
from typing import Any


def _pyplot() -> Any:
    import logging

    # with HOME unwritable matplotlib works from a temporary config folder and says so in
    # two long lines of its log; the figure is written all the same
    logging.getLogger("matplotlib").setLevel(logging.ERROR)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.hashsalt": "gptspec", "svg.fonttype": "none",
                         "font.size": 9, "axes.grid": True, "grid.alpha": 0.3})
    return plt


def _svg(fig: Any, plt: Any) -> bytes:
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="svg", metadata={"Date": None}, bbox_inches="tight")
    finally:
        plt.close(fig)
    return buffer.getvalue()


def _title(data: dict, what: str) -> str:
    """Quick-mode figures say so in their title: they prove the harness, nothing else."""
    prefix = "QUICK MODE, not a result — " if data.get("quick") else ""
    return f"{prefix}{data['title']}: {what}"


def _runs_of(data: dict, arm: str) -> list[dict]:
    return [r for r in data["runs"] if r["arm"] == arm]


def _error(interval: dict) -> float:
    low, high = interval.get("low"), interval.get("high")
    return 0.0 if low is None or high is None else (high - low) / 2


def curves(data: dict) -> bytes:
    """Bits per byte on the curve windows during training, one colour per arm (the mean
    over seeds, each seed faint), against training FLOPs (or steps, for tying)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    by_steps = data["study"] == "tying"
    for i, arm in enumerate(data["design"]["arms"]):
        runs = _runs_of(data, arm["name"])
        per_step = arm["train_flops"] / arm["steps"]
        scale = 1 if by_steps else per_step / 1e12
        colour = f"C{i % 10}"
        for r in runs:  # each seed, faint
            ax.plot([s * scale for s, _ in r["result"]["curve"]],
                    [b for _, b in r["result"]["curve"]], color=colour, lw=0.6, alpha=0.35)
        marks = [s for s, _ in runs[0]["result"]["curve"]]  # the same steps for every seed
        mean = [sum(r["result"]["curve"][k][1] for r in runs) / len(runs)
                for k in range(len(marks))]
        ax.plot([s * scale for s in marks], mean, color=colour, lw=1.6, label=arm["label"])
    ax.set_xlabel("training step" if by_steps else "training compute (TFLOP, spec formula)")
    ax.set_ylabel("validation loss (bits per byte)")
    ax.set_title(_title(data, f"learning curves ({data['design']['common']['curve_windows']} "
                              "validation windows)"))
    ax.legend(fontsize=7, ncol=2)
    return _svg(fig, plt)


def final(data: dict) -> bytes:
    """The final validation loss over the whole split against the varied quantity, mean
    and 95% interval over seeds."""
    plt = _pyplot()
    summary = data["summary"]["arms"]
    arms = data["design"]["arms"]
    study = data["study"]
    if study == "vocab":
        fig, (ax, cost) = plt.subplots(1, 2, figsize=(9, 3.8))
    else:
        fig, ax = plt.subplots(figsize=(6.5, 3.8))
    groups: dict[str, list[dict]] = {}
    for arm in arms:
        groups.setdefault(arm["group"], []).append(arm)
    for (group, members), marker in zip(groups.items(), "osD^v", strict=False):
        xs = [a["x"] for a in members]
        ys = [summary[a["name"]]["bits_per_byte"]["mean"] for a in members]
        errs = [_error(summary[a["name"]]["bits_per_byte"]) for a in members]
        ax.errorbar(xs, ys, yerr=errs, fmt=marker + ("-" if study == "vocab" else ""),
                    capsize=3, label=group or None)
        if study != "vocab":
            for a, x, y in zip(members, xs, ys, strict=True):
                ax.annotate(a["label"], (x, y), textcoords="offset points", xytext=(5, 4),
                            fontsize=7)
    if study in ("vocab", "head-width"):
        ax.set_xscale("log", base=2)
    ax.set_xlabel({"vocab": "vocabulary size V", "tying": "parameters",
                   "head-width": "head width $d_H$"}.get(study, data["design"]["varied"]))
    ax.set_ylabel("validation loss (bits per byte)")
    seeds = len(data["design"]["seeds"])
    ax.set_title(_title(data, f"mean of {seeds} seed{'s' if seeds > 1 else ''}"
                        + (", 95% interval" if seeds > 1 else "")))
    if any(groups):
        ax.legend(fontsize=7)
    if study == "vocab":
        xs = [a["x"] for a in arms]
        cost.plot(xs, [summary[a["name"]]["inference_flops_per_byte"] / 1e6 for a in arms],
                  "o-", label="inference")
        cost.plot(xs, [summary[a["name"]]["train_flops_per_byte"] / 1e6 for a in arms],
                  "s--", label="training")
        cost.set_xscale("log", base=2)
        cost.set_xlabel("vocabulary size V")
        cost.set_ylabel("MFLOP per byte of text (spec formulas)")
        cost.set_title("cost per byte")
        cost.legend(fontsize=7)
    fig.tight_layout()
    return _svg(fig, plt)


def figure_names(study: str) -> tuple[str, ...]:
    """The file names of a study's figures (what the runner writes and checks)."""
    return f"{study}-final.svg", f"{study}-curves.svg"


def figures(data: dict) -> dict[str, bytes]:
    """File name → SVG bytes of each of a study's figures."""
    final_name, curves_name = figure_names(data["study"])
    return {final_name: final(data), curves_name: curves(data)}
