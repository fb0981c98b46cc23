"""Generation and sampling of an engine that returns logits and nothing else: the judge
drives its ``forward`` (greedy_token.through_forward, sampling_distribution.through_forward).
A correct engine passes in float32 and bfloat16; one whose logits are wrong where
generation looks fails; an engine with its own generate is judged on that instead."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gptspec.conformance.runner import run_suite
from gptspec.fast.backend import TorchBackend
from meta.keyhole import LogitsOnly

THROUGH_FORWARD = ("greedy_token.through_forward", "sampling_distribution.through_forward")


def _run(backend: Any, dtype: str, checks: tuple[str, ...] = THROUGH_FORWARD):
    suite = run_suite(backend, profile="quick", area="generation", dtype=dtype,
                      select=lambda c: c.id in checks)
    assert [r.id for r in suite.results] == list(checks)
    return suite


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_correct_logits_only_engine_passes(dtype):
    suite = _run(LogitsOnly(TorchBackend(dtype=dtype)), dtype)
    assert all(r.status == "pass" and r.examples > 0 for r in suite.results), suite.results


def test_an_engine_with_its_own_generate_is_judged_on_that():
    suite = _run(TorchBackend(), "float32")
    assert [r.status for r in suite.results] == ["not-applicable"] * 2
    assert "generate.greedy_reference" in suite.results[0].detail
    assert "sampling_distribution.differential" in suite.results[1].detail


class FullContextShort(LogitsOnly):
    """An engine that keeps one slot of its window for itself: given a full context of
    n_ctx tokens it silently drops the first one (off by one in the window)."""

    def forward(self, tokens: Any, params: Any, config: Any) -> Any:
        out = np.array(super().forward(tokens, params, config))
        if tokens.shape[-1] == config.n_ctx > 1:
            out[:, -1] = np.asarray(super().forward(tokens[:, 1:], params, config))[:, -1]
        return out


class ScaledLogits(LogitsOnly):
    """An engine whose converter folds a scale into the unembedding: logits × 1.25 (the
    greedy token never changes; the distribution does)."""

    def forward(self, tokens: Any, params: Any, config: Any) -> Any:
        return np.asarray(super().forward(tokens, params, config)) * np.float32(1.25)


def test_a_window_off_by_one_fails_greedy_decoding():
    suite = _run(FullContextShort(TorchBackend()), "float32", THROUGH_FORWARD[:1])
    assert suite.results[0].status == "fail", suite.results[0]


def test_a_logit_scale_fails_the_distribution():
    suite = _run(ScaledLogits(TorchBackend()), "float32", THROUGH_FORWARD[1:])
    assert suite.results[0].status == "fail", suite.results[0]

