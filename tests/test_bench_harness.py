"""The benchmark harness's logic, with fake benchmark modules: discovery, medians over
rounds, ratios, utilisation, failures, JSON and Markdown. Nothing here asserts a time."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import run as bench  # noqa: E402
from benchmarks.report import Report  # noqa: E402

FAKES = {
    "machine": """
        def run(report, quick):
            report.metric("machine", "float32 matmul (cpu)", 100.0, "GFLOP/s")
            report.metric("machine", "memory copy (cpu)", 10.0, "GB/s")
    """,
    "alpha": """
        VALUES = iter([3.0, 1.0, 2.0])

        def run(report, quick):
            v = next(VALUES)
            report.metric("alpha", "speed", v, "tokens/s")
            report.metric("alpha", "flop rate", 10.0 * v, "GFLOP/s")
            report.metric("alpha", "bf16 flop rate", 5.0, "GFLOP/s")
            report.metric("alpha", "copy rate", 2.5 * v, "GB/s", "memory-bound here")
            report.metric("alpha", "text rate", 2.5 * v, "GB/s", "not memory traffic")
            report.ratio("alpha", "ours / peer", v / 2.0, goal=1.0, goal_text="≥ 1")
            report.ratio("alpha", "no goal", 7.0)
    """,
    "broken": """
        def run(report, quick):
            report.metric("broken", "partial", 1.0, "s")
            raise ValueError("boom\\nsecond line")
    """,
    "helper": """
        def not_a_benchmark():
            return 1
    """,
    "withcorpus": """
        def run(report, quick, corpus=None):
            report.metric("corpus", "corpus length", float(len(corpus or "")), "chars",
                          "quick" if quick else "full")
    """,
}


@pytest.fixture
def fakes(tmp_path, monkeypatch):
    package = tmp_path / "fakebench"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, source in FAKES.items():
        (package / f"{name}.py").write_text(textwrap.dedent(source))
    (package / "report.py").write_text("def run(report, quick):\n    raise AssertionError\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in list(sys.modules):
        if name.startswith("fakebench"):
            del sys.modules[name]
    return bench.discover(package, "fakebench")


def test_discovery_runs_machine_first_and_skips_non_benchmarks(fakes):
    assert [m.name for m in fakes] == ["machine", "alpha", "broken", "withcorpus"]


def test_medians_over_rounds_ratios_and_utilisation(fakes):
    result = bench.run_all(fakes, rounds=3, quick=True, corpus="abcd", log=lambda s: None)
    summary = bench.merge(result)
    metrics = {m["name"]: m for m in summary["metrics"]}
    speed = metrics["speed"]
    assert speed["values"] == [3.0, 1.0, 2.0]
    assert (speed["median"], speed["min"], speed["max"]) == (2.0, 1.0, 3.0)
    assert metrics["flop rate"]["utilisation"] == pytest.approx(0.2)  # 20 of 100 GFLOP/s
    assert metrics["flop rate"]["limit"] == "float32 matmul (cpu)"
    assert metrics["copy rate"]["utilisation"] == pytest.approx(0.5)  # 5 of 10 GB/s
    assert "utilisation" not in metrics["bf16 flop rate"]  # no bf16 limit was measured
    assert "utilisation" not in speed  # tokens/s has no machine limit
    assert "utilisation" not in metrics["text rate"]  # a byte rate not said memory-bound
    assert metrics["corpus length"]["median"] == 4.0
    ratios = {r["name"]: r for r in summary["ratios"]}
    assert ratios["ours / peer"]["median"] == 1.0 and ratios["ours / peer"]["met"] is True
    assert ratios["no goal"]["met"] is None
    assert summary["limits"] == {"float32 matmul (cpu)": 100e9, "memory copy (cpu)": 10e9}


def test_ratio_goal_not_met_is_reported(fakes):
    result = bench.run_all(fakes[:2], rounds=1, quick=True, log=lambda s: None)
    summary = bench.merge(result)  # alpha's first value is 3: 3/2 ≥ 1
    assert summary["ratios"][0]["met"] is True
    result = bench.run_all(fakes[:2], rounds=1, quick=True, log=lambda s: None)
    assert bench.merge(result)["ratios"][0]["met"] is False  # second value 1: 1/2 < 1


def test_a_failing_module_is_recorded_once_and_the_others_go_on(fakes):
    result = bench.run_all(fakes, rounds=2, quick=False, log=lambda s: None)
    assert [e["module"] for e in result.errors] == ["broken"]
    assert result.errors[0]["error"] == "ValueError: boom"
    summary = bench.merge(result)
    assert {m["name"]: len(m["values"]) for m in summary["metrics"]}["speed"] == 2
    assert summary["rounds"] == 2


def test_json_and_markdown(fakes, tmp_path):
    result = bench.run_all(fakes, rounds=3, quick=True, corpus="xy", log=lambda s: None)
    summary = {"environment": bench.environment(), "quick": True,
               "modules": [m.name for m in fakes], **bench.merge(result)}
    json_path, md_path = bench.write(summary, tmp_path / "out")
    loaded = json.loads(json_path.read_text())
    assert loaded["metrics"] == json.loads(json.dumps(summary["metrics"]))
    md = md_path.read_text()
    assert "| alpha | speed | 2 | tokens/s | 1–3 |  |  |" in md
    assert "20.0% of float32 matmul (cpu)" in md
    assert "| alpha | ours / peer | 1 | ≥ 1 | yes |" in md
    assert "- `broken`: ValueError: boom" in md
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["bench.json", "bench.md"]


def test_main_end_to_end(fakes, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "discover", lambda: fakes)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("hello")
    code = bench.main(["--quick", "--rounds", "2", "--out", str(tmp_path / "o"),
                       "--corpus", str(corpus), "--only", "alpha,withcorpus"])
    assert code == 0  # broken was not selected
    summary = json.loads((tmp_path / "o" / "bench.json").read_text())
    assert summary["modules"] == ["machine", "alpha", "withcorpus"]
    assert summary["rounds"] == 2 and summary["quick"] is True
    assert {m["name"] for m in summary["metrics"]} >= {"speed", "float32 matmul (cpu)"}
    assert bench.main(["--quick", "--out", str(tmp_path / "p")]) == 1  # broken ran
    with pytest.raises(SystemExit):
        bench.main(["--corpus", str(tmp_path / "missing")])
    with pytest.raises(SystemExit):
        bench.main(["--only", "nonexistent"])


def test_fmt():
    assert bench.fmt(2.0) == "2"
    assert bench.fmt(1234.5678) == "1235"
    assert bench.fmt(1.5e-7) == "1.500e-07"


def test_datasheet_peaks():
    from benchmarks.machine import dense_bf16_peak

    assert dense_bf16_peak("NVIDIA H100 80GB HBM3") == 989e12
    assert dense_bf16_peak("NVIDIA H100 PCIe") == 756e12
    assert dense_bf16_peak("NVIDIA A100-SXM4-80GB") == 312e12
    assert dense_bf16_peak("Some Future GPU") is None


def test_gpu_code_paths_run_on_the_cpu():
    """The CUDA benchmark's training step and decoding loop, on a tiny model on the CPU."""
    import torch

    from benchmarks.gpu import (
        GraphedGreedy,
        generate_greedy,
        generation_tokens_per_second,
        graph_step_error,
        same_tokens,
        training_tokens_per_second,
    )
    from gptspec.fast.generate import GREEDY, generate
    from gptspec.fast.model import GPT
    from gptspec.spec import PRESETS

    config = PRESETS["tiny"]
    tokens_per_second, loss_error = training_tokens_per_second(
        config, "cpu", batch=2, steps=1, warmup=1, compile=False, vocab_multiple=48)
    assert tokens_per_second > 0 and loss_error < 1e-2  # bf16 autocast on the CPU
    model = GPT(config, seed=3).eval()
    prompt = torch.randint(0, config.vocab_size, (2, 5), generator=torch.Generator().manual_seed(0))
    new = generate_greedy(model, prompt, 6)
    # the cached loop must pick what a full forward of the growing sequence picks
    seq = prompt
    with torch.no_grad():
        for _ in range(6):
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(new, seq[:, 5:])
    assert generate(model, prompt.tolist(), 6, GREEDY) == new.tolist()
    assert torch.equal(GraphedGreedy(model, 2, 11)(prompt, 6), new)  # its step, eagerly
    assert graph_step_error(model, prompt) < 1e-5
    for loop in ("generate", "generate-eager", "greedy", "graph"):
        assert generation_tokens_per_second(model, 2, 4, 3, repeats=1, loop=loop) > 0
    assert same_tokens(model, 2, 4, 5) == 1.0  # no graphs on the CPU: the same path twice


def test_the_one_token_step_traces_whole_for_the_compiled_graph():
    """The GPU benchmark's compiled loop needs the static one-token step (plan, cache
    writes, forward, argmax) traced without a graph break: dynamo's tracing is the same on
    the CPU (the eager backend skips code generation, which only the GPU run measures)."""
    import torch
    from torch._dynamo.utils import counters

    from benchmarks.gpu import GraphedGreedy, generate_greedy, graph_step_error
    from gptspec.fast.model import GPT
    from gptspec.spec import PRESETS

    torch._dynamo.reset()
    counters.clear()
    model = GPT(PRESETS["tiny"], seed=4).eval()
    prompt = torch.randint(0, model.config.vocab_size, (2, 5),
                           generator=torch.Generator().manual_seed(1))
    traced = GraphedGreedy(model, 2, 11, compile={"backend": "eager"})
    assert torch.equal(traced(prompt, 6), generate_greedy(model, prompt, 6))
    traced(prompt, 6)  # a second run, the cache's lengths grown anew: the same trace
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert graph_step_error(model, prompt, compile={"backend": "eager"}) < 1e-5


def test_reports_used_by_fakes_are_the_real_report():
    r = Report()
    r.metric("g", "n", 1.0, "s")
    assert r.to_dict()["metrics"][0]["value"] == 1.0


def test_interleaved_timing_pairs_the_peers(monkeypatch):
    """With a fake clock: each contender's median, and the median of per-repeat ratios."""
    from benchmarks import forward

    clock = [0.0]
    monkeypatch.setattr(forward.time, "perf_counter", lambda: clock[0])
    costs = {"fast": iter([1, 1, 2, 1, 5]), "peer": iter([3, 3, 4, 9, 10])}

    def contender(name):
        def fn():
            clock[0] += next(costs[name])
        return fn

    medians, ratios = forward.interleaved_seconds(
        {"fast": contender("fast"), "peer": contender("peer")}, repeats=4, device="cpu")
    # the first call of each is the warm-up (1 and 3), then 1,2,1,5 and 3,4,9,10
    assert medians == {"fast": 1.5, "peer": 6.5}
    assert ratios[("fast", "peer")] == 2.5  # median of 3, 2, 9, 2
    assert ratios[("peer", "fast")] == pytest.approx(0.41666666)  # median of 1/3,1/2,1/9,1/2


def test_the_plain_pytorch_peer_computes_gptspecs_model_given_its_weights():
    """The training race (benchmarks/recipe.py) compares like with like only if the plain
    peer's GPT is the shakespeare-char model: same parameters, same function."""
    import torch

    from benchmarks.plain_gpt import PlainGPT
    from gptspec.fast.model import GPT
    from gptspec.spec.config import preset

    config = preset("shakespeare-char")
    ours = GPT(config).double()  # in float64, only a wrong function can tell them apart
    plain = PlainGPT(config.vocab_size, config.n_ctx, config.d_model, config.n_layers,
                     config.n_heads, config.d_ff).double()
    assert (sum(p.numel() for p in plain.parameters())
            == sum(p.numel() for p in ours.parameters()))
    theirs = dict(ours.named_parameters())
    with torch.no_grad():
        plain.wte.weight.copy_(theirs["wte"])
        plain.wpe.weight.copy_(theirs["wpe"])
        plain.ln_f.load_state_dict({"weight": theirs["ln_f.weight"], "bias": theirs["ln_f.bias"]})
        for i, block in enumerate(plain.blocks):
            p = {k.removeprefix(f"blocks.{i}."): v for k, v in theirs.items()
                 if k.startswith(f"blocks.{i}.")}
            block.ln_1.load_state_dict({"weight": p["ln_1.weight"], "bias": p["ln_1.bias"]})
            block.ln_2.load_state_dict({"weight": p["ln_2.weight"], "bias": p["ln_2.bias"]})
            block.attn.qkv.load_state_dict({"weight": p["attn.w_qkv"].T, "bias": p["attn.b_qkv"]})
            block.attn.proj.load_state_dict({"weight": p["attn.w_o"].T, "bias": p["attn.b_o"]})
            block.mlp[0].load_state_dict({"weight": p["ffn.w_1"].T, "bias": p["ffn.b_1"]})
            block.mlp[2].load_state_dict({"weight": p["ffn.w_2"].T, "bias": p["ffn.b_2"]})
        tokens = torch.randint(0, config.vocab_size, (3, config.n_ctx),
                               generator=torch.Generator().manual_seed(0))
        expected, got = ours(tokens), plain(tokens)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected)  # float64's default tolerances


@pytest.mark.parametrize("steps", [1, 3, 100, 600])
def test_the_plain_peers_learning_rate_is_gptspecs_at_every_step_a_run_takes(steps):
    from benchmarks.plain_gpt import learning_rate
    from gptspec.fast.train import TrainSettings

    ours = TrainSettings(max_steps=steps)
    assert [learning_rate(s, steps, ours.lr, ours.min_lr, ours.warmup_steps)
            for s in range(steps)] == [ours.learning_rate(s) for s in range(steps)]


def test_a_gpu_record_counts_a_cut_short_run_as_unfinished(tmp_path):
    """benchmarks/cuda_results: a pytest-plugin run cut short lists fewer checks than the
    suite has; the record counts the missing ones as unfinished, and the Verification
    page shows them and an unmet goal as such."""
    import sys

    from benchmarks import cuda_results
    from gptspec.conformance.registry import all_checks

    junit = ('<testsuites><testsuite><testcase name="softmax.differential"><properties>'
             '<property name="gptspec_status" value="pass"/>'
             '<property name="gptspec_worst_fraction" value="0.25"/></properties></testcase>'
             '<testcase name="linear.differential"><properties>'
             '<property name="gptspec_status" value="fail"/>'
             '<property name="gptspec_worst_fraction" value="3.0"/></properties></testcase>'
             '</testsuite></testsuites>')
    (tmp_path / "thorough-bfloat16.xml").write_text(junit)
    (tmp_path / "bench.json").write_text(json.dumps({"environment": {}, "metrics": [], "ratios": [
        {"group": "training", "name": "MFU", "median": 0.36, "goal_text": "≥ 0.55",
         "met": False}]}))
    run = cuda_results.read_run(tmp_path, "abc1234", "a note")
    [row] = run["conformance"]
    assert row["counts"] == {"pass": 1, "fail": 1}
    assert row["unfinished"] == len(all_checks()) - 2
    assert row["worst"] == ["softmax.differential", 0.25] and row["failed"] == ["linear.differential"]
    sys.path.insert(0, "docs")
    try:
        from sitegen.verification import cuda_section
    finally:
        sys.path.remove("docs")
    page = cuda_section({"schema": "gptspec-cuda", "date": "d", "runs": [run]})
    assert f"<td>{len(all_checks()) - 2}</td>" in page and "<strong>not met</strong>" in page
