"""The forced-kernel variants of the built-in backend that the CUDA run uses. PyTorch has
a CPU FlashAttention kernel, so the flash variant is validated here too; the
memory-efficient kernel exists only on CUDA, and forcing it on the CPU must be refused
(which shows that the kernel is forced, not silently replaced by the math fallback)."""

from __future__ import annotations

import warnings

import pytest
import torch

from gptspec.conformance.runner import run_suite
from meta.sdpa_kernels import SDPAKernelBackend, efficient, flash

CHECKS = ("scaled_dot_product_attention.differential", "multi_head_attention.differential",
          "block_pre_ln.differential", "gpt_forward.differential")


def _run(backend, *ids):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # PyTorch explains each kernel choice
        suite = run_suite(backend, profile="quick", seed=0, select=lambda c: c.id in ids)
    return {r.id: r for r in suite.results}


def test_flash_attention_forced_on_the_cpu_passes_the_attention_and_model_checks():
    results = _run(flash("cpu", "float32"), *CHECKS)
    assert {k: r.status for k, r in results.items()} == dict.fromkeys(CHECKS, "pass")


def test_a_kernel_that_cannot_run_is_an_error_not_a_silent_fallback():
    results = _run(efficient("cpu", "float32"), CHECKS[0])
    r = results[CHECKS[0]]
    assert r.status == "error" and "scaled_dot_product_attention" in r.detail


def test_unknown_kernel_is_refused():
    with pytest.raises(ValueError, match="unknown SDPA kernel"):
        SDPAKernelBackend("cpu", "float32", "cudnn-magic")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("make, dtype", [(flash, "bfloat16"), (flash, "float16"),
                                         (efficient, "float32"), (efficient, "bfloat16")])
def test_fused_kernels_on_cuda_pass(make, dtype):
    results = _run(make("cuda", dtype), *CHECKS)
    assert {k: r.status for k, r in results.items()} == dict.fromkeys(CHECKS, "pass")


def test_with_cuda_the_default_run_covers_every_dtype_with_the_installed_backend_only(monkeypatch):
    import argparse

    from gptspec.cli import conformance as cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    monkeypatch.setattr(cli, "_cuda", lambda: True)
    targets = cli._targets(parser.parse_args([]))
    assert ("torch", "cpu", "float32") in targets and ("torch", "cpu", "float64") in targets
    for dtype in ("float32", "bfloat16", "float16"):
        assert ("torch", "cuda", dtype) in targets
    # the forced-kernel variants are test tooling (meta/), never installed: a default run
    # of an installed gptspec cannot name them (benchmarks/cuda_check.sh runs them)
    assert all(not spec.startswith("meta.") for spec, _, _ in targets)
    monkeypatch.setattr(cli, "_cuda", lambda: False)
    assert all(device == "cpu" for _, device, _ in cli._targets(parser.parse_args([])))
