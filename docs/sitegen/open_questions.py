"""The Open questions page: the Notes' three open questions, answered from the committed
results of ``gptspec experiment`` (``docs/experiments/<study>.json`` and its SVG figures).

Every number and every sentence of an answer is computed here from the per-seed results
in those files (the summary is computed again, not read), so the page cannot say what the
results do not. The figures are the SVGs the experiment command drew; each study's JSON
names each figure by its SHA-256, and a figure that does not match is refused.

Until a study's results are committed, its section says so and shows the design that
``gptspec experiment`` would run. Quick-mode results (``--quick``: tiny models, a few
steps, one seed) prove the harness and answer nothing: a results file that holds them is
refused (:class:`OpenQuestionsError`), as is one with fewer than ``MIN_SEEDS`` seeds.
Nothing here needs matplotlib.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gptspec.experiments.studies import SEEDS
from gptspec.reference.costs import param_count_total
from sitegen.markup import esc, public_text, table

RESULTS = Path("docs") / "experiments"
PAGE = "open-questions.md"
MIN_SEEDS = 3
SCHEMA = "gptspec-experiment"

# the spec entries each question concerns: their pages link to its section
ENTRIES = {
    "vocab": ("train", "one_hot", "token_embedding_one_hot", "token_embedding", "unembed_tied",
              "unembed_untied"),
    "tying": ("unembed_tied", "unembed_untied"),
    "head-width": ("split_heads", "multi_head_attention"),
}
ANCHORS = {"vocab": "vocabulary-size", "tying": "tied-or-untied-embeddings",
           "head-width": "head-width"}
LIMITS = {  # filled in from the results' design (its sizes)
    "vocab": "The best vocabulary here is the best for a model of {non_embedding} "
             "non-embedding parameters with a context of {n_ctx} tokens: a larger vocabulary "
             "also sees more bytes of context per window, and its embedding is a large share "
             "of so small a model. In large models the embedding is a small share of the "
             "parameters and of the FLOPs, so the cost side of the trade changes.",
    "tying": "With a vocabulary of {vocab} and d_model = {d_model} the embedding holds "
             "{share:.0%} of the tied model's parameters, which is where tying matters most; "
             "in a large model it is a small share, and these numbers say nothing about which "
             "choice wins there.",
    "head-width": "Byte-level text and a context of {n_ctx} bytes ask little of long-range "
                  "attention; what head width buys on tasks that need many distinct "
                  "long-range relations, or at widths of thousands, is not measured here.",
}


def limits(name: str, data: Mapping[str, Any]) -> str:
    """What the study cannot say, with its own sizes."""
    base = _arm(data, data["design"]["baseline"])
    return LIMITS[name].format(
        non_embedding=f"{base['non_embedding_params']:,}", n_ctx=data["design"]["common"]["n_ctx"],
        vocab=base["vocab"], d_model=base["config"]["d_model"],
        share=1 - base["non_embedding_params"] / base["params"])


class OpenQuestionsError(ValueError):
    """A results file the page cannot answer from; the message names the file."""


# --- reading -----------------------------------------------------------------------------------


def load_results(folder: Path, names: Sequence[str]) -> dict[str, dict]:
    """The committed results of each study in ``names`` that has them, checked: schema,
    study name, not quick mode, at least MIN_SEEDS seeds, every figure present and the one
    the results name."""
    from gptspec.experiments.summary import ResultsError, summarize

    found = {}
    for name in names:
        path = folder / f"{name}.json"
        if not path.exists():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            ok = isinstance(data, dict) and data.get("schema") == SCHEMA
            if not ok:
                raise ValueError(f"not a {SCHEMA} file")
            if data.get("study") != name:
                raise ValueError(f"holds the study {data.get('study')!r}")
            quick = data["quick"]
            seeds = data["design"]["seeds"]
            summary = summarize(data["design"]["arms"], data["design"]["comparisons"],
                                data["runs"])
            figures = dict(data["figures"])
        except (OSError, ValueError, KeyError, TypeError, ResultsError) as err:
            raise OpenQuestionsError(f"experiment results {path}: cannot be read: {err}") from None
        if quick is not False:
            raise OpenQuestionsError(
                f"experiment results {path} are quick-mode results, which answer nothing; run "
                f"`gptspec experiment {name}` (without --quick) or delete the file")
        if len(seeds) < MIN_SEEDS:
            raise OpenQuestionsError(f"experiment results {path} hold {len(seeds)} seed(s); the "
                                     f"page answers from at least {MIN_SEEDS}")
        for figure, digest in figures.items():
            svg = folder / figure
            if not svg.is_file():
                raise OpenQuestionsError(f"experiment results {path}: figure {svg} is missing")
            if hashlib.sha256(svg.read_bytes()).hexdigest() != digest:
                raise OpenQuestionsError(f"experiment results {path}: figure {svg} is not the "
                                         "one drawn from these results (its SHA-256 differs)")
        found[name] = {**data, "summary": summary}
    return found


# --- numbers as text ------------------------------------------------------------------------


def bpb(interval: Mapping[str, Any]) -> str:
    if interval.get("low") is None:
        return f"{interval['mean']:.3f}"
    return f"{interval['mean']:.3f} [{interval['low']:.3f}, {interval['high']:.3f}]"


def signed(interval: Mapping[str, Any]) -> str:
    if interval.get("low") is None:
        return f"{interval['mean']:+.3f}"
    return f"{interval['mean']:+.3f} [{interval['low']:+.3f}, {interval['high']:+.3f}]"


def verdict(diff: Mapping[str, Any]) -> str:
    """How a paired difference a − b reads: inside the noise, or which is lower."""
    if diff["inside_noise"]:
        return "inside the noise"
    return "lower" if diff["difference"]["mean"] < 0 else "higher"


def _label(data: Mapping[str, Any], arm: str) -> str:
    return shown(next(a["label"] for a in data["design"]["arms"] if a["name"] == arm))


def shown(label: str) -> str:
    """A label of the results as the site writes it: the studies name the head width by
    the Notes' d_H, the site by d_k (docs/notation.md)."""
    return label.replace("d_H", "d_k")


def _arm(data: Mapping[str, Any], arm: str) -> Mapping[str, Any]:
    return next(a for a in data["design"]["arms"] if a["name"] == arm)


def _names(data: Mapping[str, Any], arms: Sequence[str]) -> str:
    labels = [_label(data, a) for a in arms]
    return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]


def _noise_sentence(data: Mapping[str, Any]) -> str:
    """Which arms the seeds cannot tell from the best one, and how much worse the rest are."""
    s = data["summary"]
    close = [a for a, d in s["against_best"].items() if d["inside_noise"]]
    apart = [a for a, d in s["against_best"].items() if not d["inside_noise"]]
    parts = []
    if close:
        parts.append(f"{_names(data, close)} {'is' if len(close) == 1 else 'are'} inside the "
                     f"noise of it (the paired interval of the difference contains 0)")
    if apart:
        worst = max(apart, key=lambda a: s["against_best"][a]["difference"]["mean"])
        parts.append(f"{'the others are' if close else 'every other arm is'} worse by "
                     f"{min(s['against_best'][a]['difference']['mean'] for a in apart):.3f} to "
                     f"{s['against_best'][worst]['difference']['mean']:.3f} bits per byte "
                     f"({_label(data, worst)} the worst)")
    if not parts:
        return ""
    sentence = "; ".join(parts) + "."
    return sentence[0].upper() + sentence[1:]


# --- the answers ------------------------------------------------------------------------------


def answer_vocab(data: Mapping[str, Any]) -> str:
    s = data["summary"]
    arms = s["arms"]
    best = s["best"]
    design = data["design"]
    flops = [a["train_flops"] for a in design["arms"]]
    by_v = sorted(design["arms"], key=lambda a: a["vocab"])
    small, large = by_v[0], by_v[-1]
    text = [
        f"At equal training compute ({min(flops) / 1e12:.2f}–{max(flops) / 1e12:.2f} TFLOP per "
        f"run, the spec's C_train) and the same non-embedding model, the lowest validation loss "
        f"came from {_label(data, best)}: {bpb(arms[best]['bits_per_byte'])} bits per byte "
        f"(mean [95% interval] over {len(design['seeds'])} seeds).",
        _noise_sentence(data),
        f"The smallest vocabulary (V = {small['vocab']}) needs "
        f"{arms[small['name']]['val_tokens_per_byte']:.3f} tokens per byte of the validation "
        f"text, the largest (V = {large['vocab']}) {arms[large['name']]['val_tokens_per_byte']:.3f}; "
        f"for the same compute their models trained on "
        f"{arms[small['name']]['train_bytes_seen'] / 1e6:.1f} and "
        f"{arms[large['name']]['train_bytes_seen'] / 1e6:.1f} MB of text, and predicting a byte "
        f"costs {arms[small['name']]['inference_flops_per_byte'] / 1e3:.0f} and "
        f"{arms[large['name']]['inference_flops_per_byte'] / 1e3:.0f} kFLOP (the spec's forward "
        f"FLOPs per token × tokens per byte; "
        f"{arms[best]['inference_flops_per_byte'] / 1e3:.0f} kFLOP at the best).",
    ]
    return " ".join(t for t in text if t)


def answer_tying(data: Mapping[str, Any]) -> str:
    s = data["summary"]
    text = []
    for c in s["comparisons"]:
        a, b = _arm(data, c["a"]), _arm(data, c["b"])
        extra = a["params"] - b["params"]
        reading = verdict(c)
        what = ("the seeds do not tell them apart" if reading == "inside the noise" else
                f"the {'untied' if not a['config']['tied_embeddings'] else 'tied'} model's loss "
                f"is {reading}")
        text.append(f"At matched {c['matched']}, {a['label']} against {b['label']} "
                    f"({extra:+,} parameters): {signed(c['difference'])} bits per byte — {what}.")
    best = s["best"]
    text.append(f"The lowest loss of the four: {_label(data, best)}, "
                f"{bpb(s['arms'][best]['bits_per_byte'])} bits per byte.")
    return " ".join(text)


def _like_for_like(arm: Mapping[str, Any]) -> bool:
    """An arm with h·d_k = d_model: the same attention width and step count as the
    baseline, only the split into heads differs (the studies' group label, as written)."""
    return "≠" not in arm["group"]


def answer_head_width(data: Mapping[str, Any]) -> str:
    """Leads with the like-for-like comparison (h·d_k = d_model: only the number of heads
    changes); the free-width arms, which change the attention width and so, at equal
    compute, the step count too, come after it."""
    s = data["summary"]
    design = data["design"]
    base = design["baseline"]
    d_model = design["common"]["d_model"]
    like = [a for a in design["arms"] if _like_for_like(a)]
    best_like = min(like, key=lambda a: s["arms"][a["name"]]["bits_per_byte"]["mean"])
    text = [f"Like for like — h·d_k = d_model = {d_model}, so every arm has the same attention "
            f"width and trains for the same {best_like['steps']:,} steps at equal compute, and "
            f"only the split into heads differs — the lowest validation loss came from "
            f"{_label(data, best_like['name'])}: "
            f"{bpb(s['arms'][best_like['name']]['bits_per_byte'])} bits per byte."]
    against = [f"{_label(data, c['a'])} {signed(c['difference'])} ({verdict(c)})"
               for c in s["comparisons"] if _like_for_like(_arm(data, c["a"]))]
    if against:
        text.append(f"Each arm minus {_label(data, base)}, in bits per byte: "
                    + "; ".join(against) + ".")
    free = [f"{_label(data, c['a'])} (h·d_k = "
            f"{_arm(data, c['a'])['config']['n_heads'] * _arm(data, c['a'])['x']:.0f}, "
            f"{_arm(data, c['a'])['steps']:,} steps) {signed(c['difference'])} ({verdict(c)})"
            for c in s["comparisons"] if not _like_for_like(_arm(data, c["a"]))]
    if free:
        text.append("With the head width free of d_model, which changes the attention width "
                    "and so, at equal compute, the step count as well, each arm minus "
                    f"{_label(data, base)}: " + "; ".join(free) + ".")
    text += [f"Over all {len(design['arms'])} arms the lowest loss came from "
             f"{_label(data, s['best'])} ({bpb(s['arms'][s['best']]['bits_per_byte'])}).",
             _noise_sentence(data)]
    return " ".join(t for t in text if t)


ANSWERS = {"vocab": answer_vocab, "tying": answer_tying, "head-width": answer_head_width}


# --- the page -----------------------------------------------------------------------------------


def _arms_table(data: Mapping[str, Any]) -> str:
    arms = data["summary"]["arms"]
    rows = []
    for a in data["design"]["arms"]:
        r = arms[a["name"]]
        c = a["config"]
        rows.append([esc(shown(a["label"])), str(c["vocab_size"]), str(c["d_model"]),
                     f"{c['n_heads']} × {a['config']['d_head'] or c['d_model'] // c['n_heads']}",
                     "tied" if c["tied_embeddings"] else "untied", f"{a['params']:,}",
                     f"{a['non_embedding_params']:,}", f"{a['steps']:,}",
                     f"{a['train_flops'] / 1e12:.2f}", f"<b>{bpb(r['bits_per_byte'])}</b>",
                     f"{r['val_tokens_per_byte']:.3f}",
                     f"{r['inference_flops_per_byte'] / 1e3:.0f}",
                     f"{r['train_seconds']:.0f}"])
    return table(["arm", "V", "d_model", "h × d_k", "output", "parameters", "non-embedding",
                  "steps", "training TFLOP", "bits per byte, mean [95%]", "tokens per byte",
                  "kFLOP per byte (inference)", "training s"], rows, "gs-experiments")


def _comparisons_table(data: Mapping[str, Any]) -> str:
    s = data["summary"]
    rows = [[esc(_label(data, c["a"])), esc(_label(data, c["b"])), esc(c["matched"]),
             signed(c["difference"]), verdict(c), "yes" if c["intervals_overlap"] else "no"]
            for c in s["comparisons"]]
    return table(["arm a", "arm b", "matched", "a − b, bits per byte [95%, paired by seed]",
                  "reading", "intervals overlap"], rows, "gs-experiments")


def _provenance(data: Mapping[str, Any]) -> str:
    p = data["provenance"]
    command = p.get("command", {})
    commits = ", ".join(p.get("run_commits") or ["not recorded"])
    torch = p.get("torch") or "?"
    return (f'<p class="gs-provenance"><small>Produced by <code>gptspec experiment '
            f"{esc(command.get('name', data['study']))}</code> on {esc(p.get('date', '?'))}: "
            f"runs at gptspec commit(s) {esc(commits)} (+ marks local changes); "
            f"{esc(p.get('machine', '?'))}, {esc(p.get('cpu', '?'))} "
            f"({p.get('cores', '?')} cores), torch {esc(torch)}; {len(data['runs'])} runs, one "
            f"thread each, {command.get('jobs', '?')} at a time; the runs took "
            f"{p.get('run_process_seconds', 0) / 60:.0f} process-minutes. Data: "
            f"{esc(public_text(data['data']['source']))}, {data['data']['train_bytes']:,} bytes for training "
            f"and {data['data']['val_bytes']:,} for validation (SHA-256 "
            f"{esc(data['data']['sha256'][:12])}…). All numbers: "
            f'<a href="../experiments/{esc(data["study"])}.json">{esc(data["study"])}.json</a>.'
            "</small></p>\n")


def _planned_table(study: Any) -> str:
    from gptspec.experiments.studies import non_embedding_params
    from gptspec.reference.costs import training_flops_per_token

    rows = []
    for a in study.arms:
        c = a.config
        rows.append([esc(a.label), str(c.vocab_size), str(c.d_model), f"{c.n_heads} × {c.d_head}",
                     "tied" if c.tied_embeddings else "untied",
                     f"{param_count_total(c):,}", f"{non_embedding_params(c):,}", f"{a.steps:,}",
                     f"{a.steps * study.scale.tokens_per_step * training_flops_per_token(c) / 1e12:.2f}"])
    return table(["arm", "V", "d_model", "h × d_k", "output", "parameters", "non-embedding",
                  "steps", "training TFLOP"], rows, "gs-experiments")


def curves_caption(data: Mapping[str, Any]) -> str:
    """What the learning curves measure, and where their last point ranks the arms
    otherwise than the whole split does (the final figure, the tables and the answer)."""
    last: dict[str, list[float]] = {}
    windows = set()
    for run in data["runs"]:
        curve = run["result"]["curve"]
        if curve:
            last.setdefault(run["arm"], []).append(curve[-1][1])
        if "eval" in run["settings"]:  # recorded by every run of the harness
            windows.add(run["settings"]["eval"]["curve_windows"])
    if not last:
        return ""
    n_ctx = data["design"]["common"]["n_ctx"]
    arms = data["summary"]["arms"]
    on_curve = sorted(last, key=lambda a: sum(last[a]) / len(last[a]))
    on_split = sorted(last, key=lambda a: arms[a]["bits_per_byte"]["mean"])
    swapped = [(a, b) for i, a in enumerate(on_split) for b in on_split[i + 1:]
               if on_curve.index(b) < on_curve.index(a)]
    sample = (f", {' or '.join(map(str, sorted(windows)))} windows of {n_ctx + 1} tokens"
              if windows else "")
    text = (f"The curves are measured during training on a fixed sample of the validation "
            f"split{sample}, in bits per byte; the final figure, the tables and the answer on "
            f"the whole split ({data['data']['val_bytes']:,} bytes), after the last step.")
    def gap(a: str, b: str, split: bool) -> float:
        if split:
            return arms[b]["bits_per_byte"]["mean"] - arms[a]["bits_per_byte"]["mean"]
        return sum(last[a]) / len(last[a]) - sum(last[b]) / len(last[b])

    if swapped:
        pairs = "; ".join(f"{_label(data, a)} below {_label(data, b)} by {gap(a, b, True):.3f} "
                          f"on the whole split, above it by {gap(a, b, False):.3f} on the sample"
                          for a, b in swapped)
        text += (f" The two rank {len(swapped)} pair{'s' if len(swapped) > 1 else ''} of arms "
                 f"differently ({pairs}); the answer reads the whole split, the larger "
                 "measurement, and its paired intervals say whether such a gap is more than "
                 "the seeds' noise.")
    else:
        text += " At the last step the sample ranks the arms as the whole split does."
    return f'<p class="gs-caption"><small>{esc(text)}</small></p>\n'


def _section(name: str, study: Any, data: Mapping[str, Any] | None) -> str:
    parts = [f"## {esc(study.title)} {{ #{ANCHORS[name]} }}\n",
             f"*The question.* {esc(study.question)}\n"]
    if data is None:
        parts += [
            '<p class="gs-not-run"><strong>No results are committed yet.</strong> The study '
            "below is designed but has not been run, so this page answers nothing about it. "
            f"<code>gptspec experiment {esc(name)}</code> runs it and writes "
            f"<code>docs/experiments/{esc(name)}.json</code> and its figures.</p>\n",
            f"The design: every arm trained with the same data split, batch "
            f"({study.scale.batch_size} × {study.scale.n_ctx} tokens), optimiser and schedule, "
            f"{esc(study.matched)} matched, each with {SEEDS} seeds; validation on the whole "
            "held-out split, in bits per byte.\n",
            _planned_table(study),
        ]
        return "\n".join(parts)
    parts += [
        f"**Answer.** {esc(ANSWERS[name](data))}\n",
        f"*What it cannot say.* {esc(limits(name, data))}\n",
        f"![{esc(study.title)}: final validation loss](experiments/{name}-final.svg)\n",
        f"![{esc(study.title)}: learning curves](experiments/{name}-curves.svg)\n",
        curves_caption(data),
        _arms_table(data),
        _comparisons_table(data),
        _provenance(data),
    ]
    return "\n".join(parts)


# GPT-3 175B for scale: its parameters (Table 2.1, as the gpt3-175b preset records them) and
# its 300 billion training tokens (Brown et al. 2020, sec. 2.2)
GPT3_TOKENS = 300e9


def _orders(ratio: float) -> str:
    return f"10<sup>{round(math.log10(ratio))}</sup>"


def _scale(results: Mapping[str, Mapping[str, Any]], studies: Mapping[str, Any]) -> str:
    """The size of the evidence, from the results (or the design, before there are any)."""
    from gptspec.spec.config import GPT3_TABLE

    if results:
        arms = [a for d in results.values() for a in d["design"]["arms"]]
        tokens = [a["steps"] * d["design"]["common"]["batch_size"] * d["design"]["common"]["n_ctx"]
                  for d in results.values() for a in d["design"]["arms"]]
        data = next(iter(results.values()))
        seeds = sorted({len(d["design"]["seeds"]) for d in results.values()})
        c = data["design"]["common"]
        flops = [a["train_flops"] for a in arms]
        params = [a["params"] for a in arms]
        measured = (
            f"The evidence is small. Models of {min(params) / 1e6:.2f}–{max(params) / 1e6:.2f} "
            f"million parameters ({c['n_layers']} layers, d_model around {c['d_model']}, a "
            f"context of {c['n_ctx']} tokens), each trained for "
            f"{min(flops) / 1e12:.1f}–{max(flops) / 1e12:.1f} TFLOP — minutes of one CPU "
            f"thread — on at most {max(tokens) / 1e6:.1f} million tokens of "
            f"{esc(public_text(data['data']['source']))} ({data['data']['train_bytes'] / 1e6:.1f} MB of "
            f"training text), {' or '.join(map(str, seeds))} seeds per arm. ")
    else:
        arms = [a for s in studies.values() for a in s.arms]
        params = [param_count_total(a.config) for a in arms]
        tokens = [a.steps * s.scale.tokens_per_step for s in studies.values() for a in s.arms]
        measured = ("No results are committed yet: none of the three studies has been run for "
                    "this site, and nothing below is an answer. ")
    big = GPT3_TABLE["gpt3-175b"][1]
    return (
        "## The scale of the evidence\n\n" + measured +
        f"GPT-3's largest model has about {_orders(big / max(params))} times as many parameters "
        f"as the largest model here, and saw about {_orders(GPT3_TOKENS / max(tokens))} times as "
        "many training tokens. Effects that depend on the share "
        "of parameters in the embedding, on the amount of training per parameter, or on the "
        "task can change sign between these scales, so these studies say what holds for "
        "small models on this text, not what holds for large ones. Every arm uses one "
        "learning rate and schedule, not one tuned for it; the intervals measure the "
        "variation between seeds (initialisation and batch order), not between corpora or "
        "hyper-parameters.\n")


def page(results: Mapping[str, Mapping[str, Any]], studies: Mapping[str, Any]) -> str:
    """``results``: :func:`load_results`'s; ``studies``: name → the full design
    (``gptspec.experiments.studies``), shown for a study without results."""
    parts = [
        "# Open questions\n",
        "The *Notes on the Mathematical Structure of GPT LLM Architectures* (Becker-Kahn) "
        "name three questions their mathematics leaves open, and the evidence that would "
        "settle each: how the vocabulary size affects efficiency and prediction, what tying "
        "the embedding and unembedding does, and how the head width (their d_H, here d_k) "
        "affects what the "
        "model can capture. The model this site specifies can be varied along each of them "
        "exactly, so each question gets a controlled experiment here: arms that differ in "
        "one design choice, with everything else held fixed — the text and its split, the "
        "batch, the optimiser, the schedule's shape, the evaluation on the whole validation "
        "split — each run with several seeds (`gptspec experiment NAME`).\n",
        "Losses are in **bits per byte** of the validation text (cross-entropy summed over "
        "the split's tokens, divided by its bytes and by ln 2): per-token losses of "
        "different vocabularies are not comparable, per-byte ones are. An interval is the "
        "mean over seeds ± Student's t (95%); a difference between two arms is computed "
        "seed by seed (paired) and is called *inside the noise* when its interval contains "
        "0.\n",
        _scale(results, studies),
    ]
    for name, study in studies.items():
        parts.append(_section(name, study, results.get(name)))
    return "\n".join(parts) + "\n"


def entry_note(entry_id: str, results: Mapping[str, Any], studies: Mapping[str, Any]) -> str:
    """The paragraph an entry's page gets for each open question that concerns it."""
    parts = []
    for name, ids in ENTRIES.items():
        if entry_id not in ids:
            continue
        status = ("answered by a controlled experiment" if name in results
                  else "its experiment is designed, no results are committed yet")
        parts.append(f"- {esc(studies[name].question)} [Open questions: "
                     f"{esc(studies[name].title)}](../{PAGE}#{ANCHORS[name]}) ({status}).")
    if not parts:
        return ""
    what = "a question" if len(parts) == 1 else "questions"
    return (f"## Open questions\n\nThe Notes leave open {what} about this entry:\n\n"
            + "\n".join(parts) + "\n")

