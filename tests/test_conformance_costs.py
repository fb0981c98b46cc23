"""The size and cost checks: the torch backend passes them, and each catches a planted bug."""

from __future__ import annotations

import pytest

from gptspec.conformance.registry import all_checks, checks_for
from gptspec.conformance.runner import run_suite
from gptspec.fast.backend import TorchBackend
from gptspec.spec import REGISTRY


def _run(backend, check_id):
    suite = run_suite(backend, profile="quick", area="costs", select=lambda c: c.id == check_id)
    (result,) = suite.results
    return result


COST_CHECKS = [c.id for c in all_checks("costs")]


def test_every_cost_entry_is_checked():
    for entry in REGISTRY.by_group("costs"):
        assert checks_for(entry.id), entry.id


@pytest.mark.parametrize("check_id", COST_CHECKS)
def test_torch_backend_passes(check_id):
    result = _run(TorchBackend("cpu", "float32"), check_id)
    assert result.status == "pass", result.detail
    assert result.examples > 0 and result.comparisons > 0


class NoOutputBias(TorchBackend):
    def parameter_shapes(self, config):
        return {k: v for k, v in super().parameter_shapes(config).items()
                if not k.endswith("attn.b_o")}


class ForwardOnlyFlops(TorchBackend):
    def count_flops(self, config, batch, T, backward=False):
        return super().count_flops(config, batch, T, backward=False)


class CausalHalfOnly(TorchBackend):
    def count_flops(self, config, batch, T, backward=False):
        masked_half = batch * 2 * config.n_layers * T * T * config.d_model
        return super().count_flops(config, batch, T, backward) - masked_half


class CacheWithScratchSlot(TorchBackend):
    def kv_cache_nbytes(self, config, batch):
        per_slot = super().kv_cache_nbytes(config, batch) // config.n_ctx
        return per_slot * (config.n_ctx + 1)


class KeepsEverythingThrice(TorchBackend):
    def saved_activation_bytes(self, config, batch, T):
        return 3 * super().saved_activation_bytes(config, batch, T)


PLANTED = [
    (NoOutputBias, "param_count.matches_backend"),
    (ForwardOnlyFlops, "flops.matches_backend"),
    (CausalHalfOnly, "flops.matches_backend"),
    (CacheWithScratchSlot, "kv_cache_bytes.matches_backend"),
    (KeepsEverythingThrice, "activation_memory_bytes.estimates_backend"),
]


@pytest.mark.parametrize("backend_class, check_id", PLANTED,
                         ids=[c.__name__ for c, _ in PLANTED])
def test_planted_bug_is_caught(backend_class, check_id):
    result = _run(backend_class("cpu", "float32"), check_id)
    assert result.status == "fail", (result.status, result.detail)
